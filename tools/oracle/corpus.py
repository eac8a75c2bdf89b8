"""Training text for the tiny shared byte-level BPE tokenizer (a few KB, varied, some non-ASCII)."""

ENGLISH = """\
The quick brown fox jumps over the lazy dog. A small model runs on an ordinary computer.
Mixture-of-experts models route every token to a few experts; the rest stay idle.
Once upon a time there was a little village by the sea, where the fishermen sang at dawn.
She opened the window and the cold morning air filled the room with the smell of rain.
In 1969, two astronauts walked on the Moon while millions watched on television.
The recipe needs 2 cups of flour, 3 eggs, a pinch of salt and 250 ml of warm milk.
Please remember to save your work before the battery runs out at 5% or less.
Why do cats sleep so much? Nobody really knows, but they seem to enjoy it.
He said: "I will be there at 10:30, unless the train is late again."
The river flows north for about 300 kilometres before it reaches the ocean.
Learning a language takes time, patience and a lot of practice every single day.
The library closes at nine o'clock on weekdays and at six on Saturdays.
Our team shipped the new version on Tuesday; the tests passed on the first try.
When the sun goes down, the desert becomes very quiet and surprisingly cold.
Good software is simple, honest about its errors, and kind to the people who use it.
The old clock in the hall struck twelve, and everyone in the house was asleep.
Water boils at 100 degrees Celsius at sea level, but at a lower temperature on a mountain.
Mathematics is the language in which the book of nature is written, said Galileo.
def add(a, b):
    return a + b
for i in range(10):
    print(i * i)
if (x > 0 && y < 10) { return x + y; } else { return 0; }
{"name": "colibri", "version": "0.1.0", "experts": 8, "top_k": 2}
The weather today is sunny with a light breeze from the west; tomorrow it may rain.
Children played in the park while their parents talked about work and the news.
A good night's sleep is one of the best things you can do for your health.
The museum has paintings, sculptures, old maps and a very large collection of coins.
Trains, buses and bicycles are cheaper than cars, and often faster in a big city.
I think, therefore I am. To be or not to be, that is the question.
The first rule of optimisation: measure before you change anything at all.
"""

NON_ASCII = """\
We met at the café near the station and ordered two café au lait.
It was a naïve plan, but the naïve idea worked in the end.
Her résumé lists a year in Zürich and a summer in São Paulo.
The façade of the old hôtel was painted in a soft crème colour.
Über alles, the jalapeño salsa was the best part of the piñata party.
日本 is the name of Japan in Japanese; 日本語 is the Japanese language.
東京 is the capital of 日本, and 京都 was the old capital.
I love this! 🙂 The launch went well 🚀 and everyone said 👍.
Smiles everywhere 🙂🙂 and rockets 🚀🚀 and thumbs 👍👍.
Ελληνικά, русский язык, and العربية are written in other scripts.
Prices: 5 € for a coffee, 3 £ for tea, 100 ¥ for a rice ball.
"""


def corpus() -> str:
    # Repeat the non-ASCII part so that some multi-byte UTF-8 sequences become merged tokens.
    return ENGLISH * 2 + NON_ASCII * 6
