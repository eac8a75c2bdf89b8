// colibri dashboard: chat, the expert cache as a live grid, models and sessions.
// Plain JavaScript, no library, nothing fetched from elsewhere. Everything goes to this
// page's own origin: /v1/chat/completions for the chat, /api/* for the rest (see
// daemon/src/http/web/mod.rs). Model text is only ever put into the page as text nodes.
'use strict';
(() => {
  const $ = (id) => document.getElementById(id);

  /** An element with attributes / properties and children (strings become text). */
  function h(tag, props, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else if (k === 'dataset') Object.assign(e.dataset, v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of kids.flat()) {
      if (c === null || c === undefined || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  // ---------------------------------------------------------------- formatting
  const fmtBytes = (b) => {
    if (!isFinite(b) || b <= 0) return '0 B';
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return (b >= 100 || i === 0 ? b.toFixed(0) : b.toFixed(1)) + ' ' + u[i];
  };
  const fmtPct = (x) => (isFinite(x) ? (x * 100).toFixed(1) + '%' : '–');
  const fmtNum = (x) => (isFinite(x) ? Math.round(x).toLocaleString('en-US') : '–');
  const fmtSecs = (s) => {
    if (!isFinite(s)) return '–';
    if (s < 90) return Math.round(s) + ' s';
    if (s < 5400) return Math.round(s / 60) + ' min';
    return (s / 3600).toFixed(1) + ' h';
  };
  const fmtAgo = (ms) => {
    if (!ms) return '';
    const s = (Date.now() - ms) / 1000;
    if (s < 60) return 'just now';
    if (s < 3600) return Math.round(s / 60) + ' min ago';
    if (s < 86400) return Math.round(s / 3600) + ' h ago';
    return new Date(ms).toLocaleDateString();
  };

  // ---------------------------------------------------------------- API
  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }
  const api = {
    key: sessionStorage.getItem('colibri.key') || '',
    headers(json) {
      const hd = {};
      if (json) hd['content-type'] = 'application/json';
      if (this.key) hd.authorization = 'Bearer ' + this.key;
      return hd;
    },
    async request(method, path, body, signal) {
      const r = await fetch(path, {
        method,
        headers: this.headers(body !== undefined),
        body: body === undefined ? undefined : JSON.stringify(body),
        signal,
        cache: 'no-store',
      });
      if (r.ok) return r;
      let msg = r.status + ' ' + r.statusText;
      try {
        const j = await r.json();
        msg = (j.error && (j.error.message || j.error)) || msg;
      } catch (_) { /* not JSON */ }
      if (r.status === 401) askKey();
      throw new ApiError(r.status, msg);
    },
    async json(method, path, body) {
      return (await this.request(method, path, body)).json();
    },
  };

  /** The server-sent events of a response: {event, data} with data parsed as JSON when it
   *  is JSON ('[DONE]' and comments aside). */
  async function* sse(response) {
    const reader = response.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true }).replace(/\r\n/g, '\n');
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        let event = 'message';
        const data = [];
        for (const line of block.split('\n')) {
          if (line.startsWith(':')) continue;
          if (line.startsWith('event:')) event = line.slice(6).trim();
          else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
        }
        if (!data.length) continue;
        const text = data.join('\n');
        let parsed = text;
        if (text !== '[DONE]') {
          try { parsed = JSON.parse(text); } catch (_) { /* leave as text */ }
        }
        yield { event, data: parsed };
      }
    }
  }

  function askKey() {
    const d = $('key-dialog');
    if (!d.hidden) return;
    d.hidden = false;
    $('key-input').focus();
  }
  $('key-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    api.key = $('key-input').value.trim();
    sessionStorage.setItem('colibri.key', api.key);
    $('key-dialog').hidden = true;
    refreshStatus();
    restartLive();
  });
  // `coli web` may hand the key over in the address's fragment (never sent to a server).
  {
    const m = /(?:^#|&)key=([^&]+)/.exec(location.hash);
    if (m) {
      api.key = decodeURIComponent(m[1]);
      sessionStorage.setItem('colibri.key', api.key);
      history.replaceState(null, '', location.pathname + location.search);
    }
  }

  // ---------------------------------------------------------------- app state
  const state = {
    status: null,
    model: null, // API name of the model the grid follows and new chats use
    session: null, // {id, model, model_name}
    generating: null, // {controller}
  };
  const titles = (() => {
    try { return JSON.parse(localStorage.getItem('colibri.titles') || '{}'); } catch (_) { return {}; }
  })();
  const saveTitle = (id, t) => {
    titles[id] = t;
    try { localStorage.setItem('colibri.titles', JSON.stringify(titles)); } catch (_) { /* full */ }
  };

  // ---------------------------------------------------------------- tabs (phone width)
  const tabs = ['chat', 'experts', 'models'];
  function showTab(name, focus) {
    for (const t of tabs) {
      const on = t === name;
      const b = $('tab-' + t);
      b.setAttribute('aria-selected', on ? 'true' : 'false');
      b.tabIndex = on ? 0 : -1;
      $('pane-' + t).classList.toggle('off', !on);
    }
    if (focus) $('tab-' + name).focus();
    if (name === 'experts') requestAnimationFrame(layoutGrid);
  }
  for (const t of tabs) {
    $('tab-' + t).addEventListener('click', () => showTab(t));
    $('tab-' + t).addEventListener('keydown', (ev) => {
      const i = tabs.indexOf(t);
      if (ev.key === 'ArrowRight') showTab(tabs[(i + 1) % tabs.length], true);
      else if (ev.key === 'ArrowLeft') showTab(tabs[(i + tabs.length - 1) % tabs.length], true);
      else return;
      ev.preventDefault();
    });
  }
  showTab('chat');

  // ---------------------------------------------------------------- status, models, sessions
  let statusTimer = null;
  async function refreshStatus() {
    clearTimeout(statusTimer);
    try {
      const s = await api.json('GET', '/api/status');
      state.status = s;
      setConn(true);
      renderModels(s);
      renderSessions(s);
    } catch (e) {
      setConn(false, e.status === 401 ? 'API key needed' : 'daemon unreachable');
    }
    statusTimer = setTimeout(refreshStatus, document.hidden ? 10000 : 2500);
  }
  document.addEventListener('visibilitychange', () => { if (!document.hidden) refreshStatus(); });

  function setConn(ok, why) {
    const c = $('conn');
    c.classList.toggle('live', ok);
    c.classList.toggle('down', !ok);
    c.textContent = ok ? (live.connected ? 'live' : 'connected') : why;
  }

  function keepAliveText(m, s) {
    const k = m.keep_alive_seconds;
    const own = m.keep_alive_own ? '' : ' (daemon default)';
    if (!k) return 'kept loaded' + own;
    const left = Math.max(0, k - (m.active || m.queued ? 0 : m.idle_seconds));
    return 'unloads after ' + fmtSecs(k) + ' idle' + own + (m.active || m.queued ? '' : ', in ' + fmtSecs(left));
  }

  const KEEP_CHOICES = [
    ['default', 'daemon default'], ['0', 'never unload'], ['60', '1 minute'], ['300', '5 minutes'],
    ['1800', '30 minutes'], ['3600', '1 hour'], ['14400', '4 hours'],
  ];

  function renderModels(s) {
    const sel = $('model-select');
    const names = s.models.map((m) => m.name);
    if (!names.includes(state.model)) {
      state.model = names[0] || null;
      restartLive();
    }
    // Rebuild the select only when the list changed (keeps focus and keyboard state).
    const want = names.join('\n');
    if (sel.dataset.names !== want) {
      sel.replaceChildren(...(names.length ? names.map((n) => h('option', { value: n, text: n }))
        : [h('option', { value: '', text: 'no model loaded' })]));
      sel.dataset.names = want;
    }
    sel.value = state.model || '';
    sel.disabled = !names.length;

    const list = $('model-list');
    const focused = document.activeElement && list.contains(document.activeElement) ? document.activeElement.id : null;
    const sig = JSON.stringify([state.model, s.keep_alive_seconds, s.models.map((m) => [m.name, m.keep_alive_own, m.keep_alive_seconds, m.streamed, m.cache.pinned_experts])]);
    if (list.dataset.sig === sig) {
      // Nothing structural changed: refresh the figures only (controls, focus and notes stay).
      for (const m of s.models) {
        const line = document.getElementById('ml-' + cssId(m.name));
        if (line) line.textContent = modelLine(m);
        const ka = document.getElementById('mk-' + cssId(m.name));
        if (ka) ka.textContent = keepAliveText(m, s);
      }
      return;
    }
    list.dataset.sig = sig;
    if (!s.models.length) {
      list.replaceChildren(h('li', { class: 'empty' }, 'No model is loaded. Load one below, or run ', h('code', { text: 'coli web --model DIR' }), '.'));
      return;
    }
    list.replaceChildren(...s.models.map((m) => modelCard(m, s)));
    if (focused && document.getElementById(focused)) document.getElementById(focused).focus();
  }

  const cssId = (name) => name.replace(/[^A-Za-z0-9_-]/g, '_');

  function modelLine(m) {
    const doing = m.active || m.queued ? m.active + ' running, ' + m.queued + ' queued' : 'idle ' + fmtSecs(m.idle_seconds);
    const mem = m.streamed
      ? fmtBytes(m.resident_bytes) + ' resident + ' + fmtBytes(m.cache.used_bytes) + ' of ' + fmtBytes(m.cache.budget_bytes) + ' expert cache'
      : fmtBytes(m.weight_bytes) + ' in RAM';
    return m.model_type + ', ' + m.layers + ' layers, context ' + fmtNum(m.max_context) + ' · ' + doing +
      ' · ' + fmtNum(m.tokens_generated) + ' tokens out · ' + mem + ', KV ' + fmtBytes(m.kv_bytes);
  }

  function modelCard(m, s) {
    const id = cssId(m.name);
    const keepSel = h('select', { id: 'mks-' + id, 'aria-label': 'Keep-alive of ' + m.name });
    for (const [v, label] of KEEP_CHOICES) {
      keepSel.append(h('option', { value: v, text: v === 'default' ? label + ' (' + (s.keep_alive_seconds ? fmtSecs(s.keep_alive_seconds) : 'never') + ')' : label }));
    }
    const current = m.keep_alive_own ? String(Math.round(m.keep_alive_seconds)) : 'default';
    if (![...keepSel.options].some((o) => o.value === current)) {
      keepSel.append(h('option', { value: current, text: fmtSecs(m.keep_alive_seconds) }));
    }
    keepSel.value = current;
    keepSel.addEventListener('change', async () => {
      const v = keepSel.value;
      try {
        await api.json('POST', '/api/models/keep_alive', { model: m.name, seconds: v === 'default' ? null : Number(v) });
        note('model-msg-' + id, 'keep-alive set');
      } catch (e) { note('model-msg-' + id, e.message, true); }
      refreshStatus();
    });
    const hottest = h('input', { id: 'mph-' + id, type: 'number', min: '1', value: '16', 'aria-label': 'How many of the hottest experts to pin' });
    const pinBtn = h('button', { type: 'button', id: 'mp-' + id, text: 'Pin hottest', disabled: !m.streamed,
      title: m.streamed ? '' : 'pins keep streamed experts in RAM; this model is resident' });
    pinBtn.addEventListener('click', async () => {
      const n = parseInt(hottest.value, 10);
      if (!(n > 0)) { note('model-msg-' + id, 'give a number of experts', true); return; }
      try {
        const r = await api.json('POST', '/api/pins', { model: m.name, hottest: n });
        note('model-msg-' + id, r.pinned.length + ' experts pinned');
      } catch (e) { note('model-msg-' + id, e.message, true); }
      refreshStatus();
    });
    const unpinBtn = h('button', { type: 'button', text: 'Unpin all', disabled: !m.cache.pinned_experts });
    unpinBtn.addEventListener('click', async () => {
      try {
        await api.json('POST', '/api/unpin', { model: m.name, all: true });
        note('model-msg-' + id, 'unpinned');
      } catch (e) { note('model-msg-' + id, e.message, true); }
      refreshStatus();
    });
    const unloadBtn = h('button', { type: 'button', class: 'danger', text: 'Unload', id: 'mu-' + id });
    unloadBtn.addEventListener('click', async () => {
      if (!confirm('Unload ' + m.name + '? Its sessions are saved first.')) return;
      unloadBtn.disabled = true;
      try {
        const r = await api.json('POST', '/api/models/unload', { model: m.name });
        note('load-msg', 'unloaded ' + m.name + ' (' + r.sessions_saved + ' sessions saved)');
      } catch (e) { note('model-msg-' + id, e.message, true); unloadBtn.disabled = false; }
      refreshStatus();
    });
    return h('li', { class: 'card' + (m.name === state.model ? ' current' : '') },
      h('h3', { text: m.name, title: m.id }),
      h('p', { class: 'line', id: 'ml-' + id, text: modelLine(m) }),
      h('p', { class: 'line', id: 'mk-' + id, text: keepAliveText(m, s) }),
      h('p', { class: 'line', text: m.streamed
        ? 'experts streamed (' + m.cache.policy + '), ' + fmtNum(m.cache.pinned_experts) + ' pinned of ' + fmtNum(m.cache.total_experts)
        : 'experts resident: ' + fmtNum(m.cache.total_experts) }),
      h('div', { class: 'controls' }, h('label', { class: 'muted' }, 'Keep-alive ', keepSel)),
      h('div', { class: 'controls' }, hottest, pinBtn, unpinBtn, unloadBtn),
      h('p', { class: 'msg' + (notes['model-msg-' + id] && notes['model-msg-' + id].error ? ' error' : ''),
        id: 'model-msg-' + id, role: 'status', text: notes['model-msg-' + id] ? notes['model-msg-' + id].text : '' }));
  }

  // Notes outlive a re-rendered card.
  const notes = {};
  function note(id, text, error) {
    notes[id] = { text, error: !!error };
    const e = $(id);
    if (!e) return;
    e.textContent = text;
    e.classList.toggle('error', !!error);
  }

  $('model-select').addEventListener('change', () => {
    state.model = $('model-select').value || null;
    restartLive();
    if (state.status) renderModels(state.status);
  });

  $('load-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const path = $('load-path').value.trim();
    if (!path) { note('load-msg', 'give the model folder', true); $('load-path').focus(); return; }
    const cache = $('load-cache').value.trim();
    const prog = $('load-progress');
    $('load-button').disabled = true;
    prog.hidden = false;
    prog.removeAttribute('value');
    note('load-msg', 'opening ' + path + '…');
    try {
      const r = await api.request('POST', '/api/models/load', { model: path, expert_cache: cache || null });
      for await (const ev2 of sse(r)) {
        const d = ev2.data;
        if (ev2.event === 'progress') {
          if (d.total) { prog.max = d.total; prog.value = d.done; }
          note('load-msg', d.total ? 'loading ' + fmtBytes(d.done) + ' of ' + fmtBytes(d.total) : d.message);
        } else if (ev2.event === 'ready') {
          note('load-msg', (d.already_loaded ? 'already loaded: ' : 'loaded ') + d.model);
          state.model = d.model;
          restartLive();
        } else if (ev2.event === 'error') {
          note('load-msg', d.message, true);
        }
      }
    } catch (e) {
      note('load-msg', e.message, true);
    } finally {
      $('load-button').disabled = false;
      prog.hidden = true;
      refreshStatus();
    }
  });

  function renderSessions(s) {
    const list = $('session-list');
    const sig = JSON.stringify(s.sessions.map((x) => [x.id, x.state, x.messages, x.last_used_unix_ms, titles[x.id], state.session && state.session.id]));
    if (list.dataset.sig === sig) return;
    const focused = document.activeElement && list.contains(document.activeElement) ? document.activeElement.id : null;
    list.dataset.sig = sig;
    if (!s.sessions.length) {
      list.replaceChildren(h('li', { class: 'muted' }, 'No conversations yet.'));
      return;
    }
    list.replaceChildren(...s.sessions.map((x) => {
      const title = titles[x.id] || x.id;
      const sub = (x.model_name || x.model.split('/').pop()) + ' · ' + x.messages + ' messages · ' + x.state + ' · ' + fmtAgo(x.last_used_unix_ms);
      const open = h('button', { type: 'button', class: 'open', id: 'so-' + x.id, 'aria-label': 'Open conversation ' + title },
        h('span', { class: 't', text: title }), h('span', { class: 's', text: sub }));
      open.addEventListener('click', () => openSession(x));
      const del = h('button', { type: 'button', class: 'del', id: 'sd-' + x.id, 'aria-label': 'Delete conversation ' + title, text: '✕' });
      del.addEventListener('click', async () => {
        if (!confirm('Delete the conversation "' + title + '"?')) return;
        try {
          await api.json('DELETE', '/api/sessions/' + encodeURIComponent(x.id));
          if (state.session && state.session.id === x.id) newChat();
        } catch (e) { note('chat-msg', e.message, true); }
        refreshStatus();
      });
      return h('li', { class: state.session && state.session.id === x.id ? 'current' : '' }, open, del);
    }));
    if (focused && document.getElementById(focused)) document.getElementById(focused).focus();
  }

  // ---------------------------------------------------------------- chat
  function newChat() {
    if (state.generating) stopGenerating();
    state.session = null;
    $('messages').replaceChildren(h('p', { class: 'empty', text: 'Ask something. Replies stream from the model; the expert grid shows which experts each token uses.' }));
    $('conversation-title').textContent = 'New chat';
    note('chat-msg', '');
    if (state.status) renderSessions(state.status);
  }
  $('new-chat').addEventListener('click', () => { newChat(); showTab('chat'); $('prompt').focus(); });

  async function openSession(x) {
    if (state.generating) stopGenerating();
    note('chat-msg', 'opening…');
    try {
      const r = await api.json('GET', '/api/sessions/' + encodeURIComponent(x.id));
      state.session = { id: x.id, model: r.session.model, model_name: r.session.model_name };
      const box = $('messages');
      box.replaceChildren();
      for (const m of r.messages) {
        if (m.role === 'user') box.append(userBubble(m.content));
        else if (m.role === 'assistant') {
          const b = assistantBubble();
          b.setText(m.content);
          b.finish();
          box.append(b.root);
        }
      }
      if (!r.messages.length) box.append(h('p', { class: 'empty', text: 'An empty conversation.' }));
      const firstUser = r.messages.find((m) => m.role === 'user');
      if (firstUser && !titles[x.id]) saveTitle(x.id, firstUser.content.slice(0, 60));
      $('conversation-title').textContent = titles[x.id] || x.id;
      if (r.session.model_name && r.session.model_name !== state.model) {
        state.model = r.session.model_name;
        $('model-select').value = state.model;
        restartLive();
      }
      note('chat-msg', r.restored_from_disk ? 'restored from its snapshot on disk' : '');
      box.scrollTop = box.scrollHeight;
      showTab('chat');
      $('prompt').focus();
    } catch (e) {
      note('chat-msg', e.message, true);
    }
    refreshStatus();
  }

  function userBubble(text) {
    return h('div', { class: 'msg-user', text });
  }

  /** Splits a reply into its thinking and its answer: text between <think> and </think>
   *  (or before a lone </think>, when the template opened the block) is thinking. */
  function splitThinking(text) {
    const open = text.indexOf('<think>');
    const close = text.indexOf('</think>');
    if (open >= 0 && (close < 0 || open < close)) {
      const before = text.slice(0, open);
      if (close < 0) return { thinking: text.slice(open + 7), answer: before, open: true };
      return { thinking: text.slice(open + 7, close), answer: before + text.slice(close + 8), open: false };
    }
    if (close >= 0) return { thinking: text.slice(0, close), answer: text.slice(close + 8), open: false };
    return { thinking: '', answer: text, open: false };
  }

  /** A reply being written: raw text in, Markdown out, thinking folded away. */
  function assistantBubble() {
    const think = h('details', { class: 'thinking', hidden: true }, h('summary', { text: 'Thinking…' }), h('div', { class: 'think-body' }));
    const body = h('div', { class: 'body' });
    const foot = h('div', { class: 'reply-stats', hidden: true });
    const root = h('div', { class: 'msg-assistant' }, think, body, foot);
    let text = '';
    let reasoning = '';
    let pending = false;
    let thinkStart = null;
    let thinkSecs = null;
    let done = false;
    const render = (final) => {
      pending = false;
      // A frame scheduled while streaming may land after the end: it renders the end.
      final = final || done;
      const s = splitThinking(text);
      const t = (reasoning + s.thinking).replace(/^\s+/, '');
      if (t) {
        think.hidden = false;
        think.querySelector('.think-body').textContent = t;
        if (thinkStart === null) thinkStart = performance.now();
        const stillThinking = !final && (s.open || (reasoning && !s.answer.trim()));
        if (!stillThinking && thinkSecs === null && thinkStart !== null) thinkSecs = (performance.now() - thinkStart) / 1000;
        think.querySelector('summary').textContent = stillThinking ? 'Thinking…'
          : 'Thought' + (thinkSecs !== null && thinkSecs > 0.05 ? ' for ' + thinkSecs.toFixed(1) + ' s' : '');
      }
      body.replaceChildren(markdown(s.answer.replace(/^\s+/, '')));
      body.classList.toggle('cursor', !final);
    };
    const schedule = () => {
      if (!pending) { pending = true; requestAnimationFrame(() => render(false)); }
    };
    return {
      root,
      get text() { return text; },
      append(t) { text += t; schedule(); },
      appendReasoning(t) { reasoning += t; schedule(); },
      setText(t) { text = t; done = true; render(true); },
      finish() { done = true; render(true); },
      stats(t, stopped) {
        foot.hidden = false;
        foot.textContent = t;
        foot.classList.toggle('stopped', !!stopped);
      },
      error(msg) { root.append(h('div', { class: 'reply-error', role: 'alert', text: msg })); },
    };
  }

  // A small, safe Markdown: fenced code, headings, lists, quotes, rules, paragraphs;
  // inline code, bold, italics, links (http(s) only). Built as DOM nodes, never HTML.
  function markdown(src) {
    const frag = document.createDocumentFragment();
    const lines = src.split('\n');
    let i = 0;
    let para = [];
    const flush = () => {
      if (!para.length) return;
      const p = h('p');
      para.forEach((l, k) => { if (k) p.append(h('br')); p.append(inline(l)); });
      frag.append(p);
      para = [];
    };
    while (i < lines.length) {
      const line = lines[i];
      const fence = /^\s*(```+|~~~+)\s*([\w+#.-]*)/.exec(line);
      if (fence) {
        flush();
        const mark = fence[1];
        const code = [];
        i++;
        while (i < lines.length && !lines[i].trim().startsWith(mark)) code.push(lines[i++]);
        i++; // the closing fence (or the end of a reply still streaming)
        const codeEl = h('code', { class: fence[2] ? 'lang-' + fence[2] : null, text: code.join('\n') });
        const copy = h('button', { type: 'button', class: 'copy', text: 'Copy', 'aria-label': 'Copy code' });
        copy.addEventListener('click', () => {
          const done = () => { copy.textContent = 'Copied'; setTimeout(() => { copy.textContent = 'Copy'; }, 1200); };
          if (navigator.clipboard) navigator.clipboard.writeText(codeEl.textContent).then(done, () => {});
        });
        frag.append(h('pre', {}, copy, codeEl));
        continue;
      }
      const head = /^(#{1,6})\s+(.*)$/.exec(line);
      if (head) {
        flush();
        frag.append(h('h' + Math.min(4, head[1].length + 1), {}, inline(head[2])));
        i++;
        continue;
      }
      if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) { flush(); frag.append(h('hr')); i++; continue; }
      if (/^\s*>/.test(line)) {
        flush();
        const q = [];
        while (i < lines.length && /^\s*>/.test(lines[i])) q.push(lines[i++].replace(/^\s*>\s?/, ''));
        frag.append(h('blockquote', {}, markdown(q.join('\n'))));
        continue;
      }
      const item = /^\s*([-*+]|\d+[.)])\s+/.exec(line);
      if (item) {
        flush();
        const ordered = /\d/.test(item[1]);
        const list = h(ordered ? 'ol' : 'ul');
        while (i < lines.length) {
          const m = /^\s*([-*+]|\d+[.)])\s+(.*)$/.exec(lines[i]);
          if (!m || /\d/.test(m[1]) !== ordered) break;
          list.append(h('li', {}, inline(m[2])));
          i++;
        }
        frag.append(list);
        continue;
      }
      if (!line.trim()) { flush(); i++; continue; }
      para.push(line);
      i++;
    }
    flush();
    return frag;
  }

  const INLINE = [
    { re: /`([^`]+)`/, make: (m) => h('code', { text: m[1] }) },
    { re: /\*\*([^*]+?)\*\*/, make: (m) => h('strong', {}, inline(m[1])) },
    { re: /__([^_]+?)__/, make: (m) => h('strong', {}, inline(m[1])) },
    { re: /\*([^*\s](?:[^*]*[^*\s])?)\*/, make: (m) => h('em', {}, inline(m[1])) },
    { re: /\b_([^_\s](?:[^_]*[^_\s])?)_\b/, make: (m) => h('em', {}, inline(m[1])) },
    { re: /\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/, make: (m) => h('a', { href: m[2], target: '_blank', rel: 'noopener noreferrer' }, inline(m[1])) },
  ];
  function inline(text) {
    const frag = document.createDocumentFragment();
    let rest = text;
    while (rest) {
      let best = null;
      for (const r of INLINE) {
        const m = r.re.exec(rest);
        if (m && (!best || m.index < best.m.index)) best = { m, r };
      }
      if (!best) { frag.append(rest); break; }
      if (best.m.index) frag.append(rest.slice(0, best.m.index));
      frag.append(best.r.make(best.m));
      rest = rest.slice(best.m.index + best.m[0].length);
    }
    return frag;
  }

  function setGenerating(on) {
    $('send').disabled = on;
    $('stop').disabled = !on;
  }

  function stopGenerating() {
    if (state.generating) state.generating.controller.abort();
  }
  $('stop').addEventListener('click', () => { stopGenerating(); $('prompt').focus(); });
  document.addEventListener('keydown', (ev) => {
    if (ev.key === 'Escape' && state.generating) { ev.preventDefault(); stopGenerating(); }
  });
  $('prompt').addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      $('chat-form').requestSubmit();
    }
  });
  $('chat-form').addEventListener('submit', (ev) => { ev.preventDefault(); send(); });

  async function send() {
    const text = $('prompt').value;
    if (!text.trim() || state.generating) return;
    if (!state.model && !state.session) { note('chat-msg', 'no model is loaded: load one in the Models pane', true); return; }
    const controller = new AbortController();
    state.generating = { controller };
    setGenerating(true);
    note('chat-msg', '');
    const box = $('messages');
    const first = !state.session;
    let reply = null;
    const t0 = performance.now();
    let tFirst = null;
    let chunks = 0;
    let usage = null;
    let timings = null;
    let finish = null;
    try {
      if (!state.session) {
        const s = await api.json('POST', '/api/sessions', { model: state.model });
        state.session = { id: s.id, model: s.model, model_name: s.model_name || state.model };
        box.replaceChildren();
        saveTitle(s.id, text.trim().slice(0, 60));
        $('conversation-title').textContent = titles[s.id];
      }
      $('prompt').value = '';
      box.append(userBubble(text));
      reply = assistantBubble();
      box.append(reply.root);
      box.scrollTop = box.scrollHeight;
      const messages = [];
      const system = $('system').value.trim();
      if (first && system) messages.push({ role: 'system', content: system });
      messages.push({ role: 'user', content: text });
      const body = {
        model: state.session.model_name || state.session.model,
        session_id: state.session.id,
        messages,
        stream: true,
        stream_options: { include_usage: true },
      };
      const temp = parseFloat($('temperature').value);
      if (isFinite(temp)) body.temperature = temp;
      const maxTok = parseInt($('max-tokens').value, 10);
      if (maxTok > 0) body.max_tokens = maxTok;
      const r = await api.request('POST', '/v1/chat/completions', body, controller.signal);
      for await (const ev of sse(r)) {
        const d = ev.data;
        if (d === '[DONE]') break;
        if (d && d.error) { reply.error(d.error.message || String(d.error)); continue; }
        if (d && d.usage) usage = d.usage;
        if (d && d.timings) timings = d.timings;
        const c = d && d.choices && d.choices[0];
        if (!c) continue;
        const delta = c.delta || {};
        const piece = delta.content || '';
        const think = delta.reasoning_content || delta.reasoning || '';
        if (piece || think) {
          if (tFirst === null) tFirst = performance.now();
          chunks++;
          if (think) reply.appendReasoning(think);
          if (piece) reply.append(piece);
          const nearBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
          if (nearBottom) requestAnimationFrame(() => { box.scrollTop = box.scrollHeight; });
        }
        if (c.finish_reason) finish = c.finish_reason;
      }
      reply.finish();
      reply.stats(replyStats(usage, timings, t0, tFirst, chunks, finish), false);
    } catch (e) {
      if (reply) reply.finish();
      if (e.name === 'AbortError') {
        if (reply) reply.stats('stopped · ' + replyStats(null, null, t0, tFirst, chunks, null), true);
      } else if (reply) {
        reply.error(e.message);
      } else {
        note('chat-msg', e.message, true);
      }
    } finally {
      state.generating = null;
      setGenerating(false);
      refreshStatus();
      // The engine publishes its figures after the last event: look again shortly.
      setTimeout(refreshStatus, 400);
    }
  }

  /** tok/s, time to first token, tokens, cached prompt tokens: the daemon's figures when
   *  the stream carried them, else measured here. */
  function replyStats(usage, timings, t0, tFirst, chunks, finish) {
    const parts = [];
    const now = performance.now();
    if (timings && timings.predicted_per_second > 0) parts.push(timings.predicted_per_second.toFixed(1) + ' tok/s');
    else if (tFirst !== null && chunks > 1) parts.push(((chunks - 1) / ((now - tFirst) / 1000)).toFixed(1) + ' tok/s');
    const ttft = timings && timings.time_to_first_token_ms > 0 ? timings.time_to_first_token_ms : tFirst !== null ? tFirst - t0 : null;
    if (ttft !== null) parts.push('TTFT ' + (ttft < 1000 ? ttft.toFixed(0) + ' ms' : (ttft / 1000).toFixed(2) + ' s'));
    if (usage) {
      parts.push(usage.completion_tokens + ' tokens');
      const cached = (usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens) || 0;
      parts.push(usage.prompt_tokens + ' prompt (' + cached + ' cached)');
    } else {
      parts.push(chunks + ' tokens');
    }
    if (timings && typeof timings.expert_cache_hit_rate === 'number') parts.push('expert hits ' + fmtPct(timings.expert_cache_hit_rate));
    if (finish === 'length') parts.push('hit max tokens');
    return parts.join(' · ');
  }

  // ---------------------------------------------------------------- expert grid
  const CODE = { NONE: 0, DISK: 1, READING: 2, CACHED: 3, PINNED: 4, PINNED_DISK: 5, RESIDENT: 6 };
  const NAMES = ['no expert (dense layer)', 'on disk', 'being read', 'cached', 'pinned, in RAM', 'pinned, on disk', 'in RAM (not streamed)'];
  // [r, g, b] at full brightness per code; dim = used little.
  const COLORS = [[11, 13, 17], [120, 140, 170], [255, 176, 32], [53, 196, 106], [176, 124, 255], [110, 80, 160], [47, 179, 168]];
  const BG = [22, 26, 33];

  const grid = {
    layers: 0, width: 0, cells: new Uint8Array(0), uses: new Float64Array(0), maxUse: 0,
    last: [], flashAt: 0, observed: 0, cursor: null, hover: null,
    // layout in canvas pixels
    dpr: 1, ox: 0, oy: 0, cw: 0, ch: 0, big: false,
    off: document.createElement('canvas'),
  };

  function applySnapshot(s) {
    const g = s.grid;
    grid.layers = g.layers;
    grid.width = g.experts;
    grid.cells = new Uint8Array(g.layers * g.experts);
    for (let i = 0; i < grid.cells.length; i++) grid.cells[i] = g.cells.charCodeAt(i) - 48;
    grid.uses = Float64Array.from(g.uses);
    grid.maxUse = 0;
    for (const u of grid.uses) if (u > grid.maxUse) grid.maxUse = u;
    grid.last = g.last;
    grid.observed = g.observed;
    grid.flashAt = performance.now();
    const c = $('grid');
    c.dataset.layers = g.layers;
    c.dataset.experts = g.experts;
    $('grid-shape').textContent = g.layers + ' layers × ' + g.experts + ' experts';
    layoutGrid();
  }

  function applyDelta(d) {
    if (!d) return;
    if (d.reset) { restartLive(); return; }
    for (let k = 0; k + 1 < d.cells.length; k += 2) grid.cells[d.cells[k]] = d.cells[k + 1];
    for (let k = 0; k + 1 < d.uses.length; k += 2) {
      grid.uses[d.uses[k]] = d.uses[k + 1];
      if (d.uses[k + 1] > grid.maxUse) grid.maxUse = d.uses[k + 1];
    }
    if (d.last) { grid.last = d.last; grid.flashAt = performance.now(); }
    grid.observed = d.observed;
    scheduleDraw();
  }

  function layoutGrid() {
    const c = $('grid');
    const wrap = $('grid-wrap');
    const cssW = wrap.clientWidth;
    if (!cssW || !grid.width) return;
    const dpr = window.devicePixelRatio || 1;
    const W = Math.round(cssW * dpr);
    const ox = Math.round(30 * dpr);
    const oy = Math.round(16 * dpr);
    const cw = Math.max(1, (W - ox - 2) / grid.width);
    const maxH = Math.max(160, window.innerHeight * 0.5) * dpr;
    const ch = Math.max(3 * dpr, Math.min(Math.max(cw, 3 * dpr), 28 * dpr, (maxH - oy) / Math.max(1, grid.layers)));
    Object.assign(grid, { dpr, ox, oy, cw, ch, big: grid.width * grid.layers > 4096 || cw < 6 * dpr });
    c.width = W;
    c.height = Math.round(oy + ch * grid.layers + 2);
    c.style.height = c.height / dpr + 'px';
    draw();
  }
  if (window.ResizeObserver) new ResizeObserver(() => layoutGrid()).observe($('grid-wrap'));

  function cellColor(i, out) {
    const code = grid.cells[i];
    const base = COLORS[code] || COLORS[0];
    if (code === CODE.NONE) { out[0] = base[0]; out[1] = base[1]; out[2] = base[2]; return; }
    const u = grid.uses[i];
    const f = grid.maxUse > 0 ? 0.28 + 0.72 * Math.log1p(u) / Math.log1p(grid.maxUse) : 0.28;
    out[0] = BG[0] + (base[0] - BG[0]) * f;
    out[1] = BG[1] + (base[1] - BG[1]) * f;
    out[2] = BG[2] + (base[2] - BG[2]) * f;
  }

  let drawPending = false;
  function scheduleDraw() {
    if (!drawPending) { drawPending = true; requestAnimationFrame(() => { drawPending = false; draw(); }); }
  }

  const FLASH_MS = 700;
  function draw() {
    const c = $('grid');
    if (!grid.width || !c.width) return;
    const ctx = c.getContext('2d');
    const { ox, oy, cw, ch, dpr } = grid;
    ctx.fillStyle = '#0b0d11';
    ctx.fillRect(0, 0, c.width, c.height);
    const rgb = [0, 0, 0];
    if (grid.big) {
      // One pixel per cell, scaled up without smoothing: 20k cells cost one small image.
      const off = grid.off;
      if (off.width !== grid.width || off.height !== grid.layers) { off.width = grid.width; off.height = grid.layers; }
      const octx = off.getContext('2d');
      const img = octx.createImageData(grid.width, grid.layers);
      const px = img.data;
      for (let i = 0; i < grid.cells.length; i++) {
        cellColor(i, rgb);
        px[4 * i] = rgb[0]; px[4 * i + 1] = rgb[1]; px[4 * i + 2] = rgb[2]; px[4 * i + 3] = 255;
      }
      octx.putImageData(img, 0, 0);
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(off, ox, oy, grid.width * cw, grid.layers * ch);
    } else {
      const gap = Math.max(1, Math.round(dpr));
      for (let l = 0; l < grid.layers; l++) {
        for (let e = 0; e < grid.width; e++) {
          cellColor(l * grid.width + e, rgb);
          ctx.fillStyle = 'rgb(' + (rgb[0] | 0) + ',' + (rgb[1] | 0) + ',' + (rgb[2] | 0) + ')';
          ctx.fillRect(ox + e * cw, oy + l * ch, cw - gap, ch - gap);
        }
      }
    }
    // Dense layers (no routed experts) say so when there is room.
    if (ch >= 10 * dpr) {
      ctx.fillStyle = '#4b5563';
      ctx.font = Math.round(Math.min(11 * dpr, ch * 0.7)) + 'px system-ui, sans-serif';
      ctx.textBaseline = 'middle';
      ctx.textAlign = 'left';
      for (let l = 0; l < grid.layers; l++) {
        if (grid.cells[l * grid.width] === CODE.NONE) ctx.fillText('dense layer', ox + 6 * dpr, oy + l * ch + ch / 2);
      }
    }
    // The experts the latest token went to: a white flash that settles to a faint mark.
    const age = performance.now() - grid.flashAt;
    const alpha = Math.max(0.35, 0.95 * (1 - age / FLASH_MS));
    ctx.fillStyle = 'rgba(255,255,255,' + alpha.toFixed(3) + ')';
    for (let l = 0; l < grid.last.length && l < grid.layers; l++) {
      for (const e of grid.last[l]) {
        if (e < grid.width) ctx.fillRect(ox + e * cw, oy + l * ch, Math.max(1, cw - (grid.big ? 0 : 1)), Math.max(1, ch - (grid.big ? 0 : 1)));
      }
    }
    // Axis labels: layers down the left, experts along the top.
    ctx.fillStyle = '#9aa3b2';
    ctx.font = Math.round(10 * dpr) + 'px system-ui, sans-serif';
    ctx.textBaseline = 'middle';
    ctx.textAlign = 'right';
    const rowStep = Math.max(1, Math.ceil((12 * dpr) / ch));
    for (let l = 0; l < grid.layers; l += rowStep) ctx.fillText(String(l), ox - 4 * dpr, oy + l * ch + ch / 2);
    ctx.textAlign = 'center';
    ctx.textBaseline = 'alphabetic';
    const colStep = Math.max(1, [1, 2, 4, 8, 16, 32, 64, 128].find((s) => s * cw >= 26 * dpr) || 256);
    for (let e = 0; e < grid.width; e += colStep) ctx.fillText(String(e), ox + e * cw + cw / 2, oy - 4 * dpr);
    // The cell under the pointer or the keyboard cursor.
    const at = grid.hover || (document.activeElement === c ? grid.cursor : null);
    if (at) {
      ctx.strokeStyle = '#7cc4ff';
      ctx.lineWidth = Math.max(1, dpr);
      ctx.strokeRect(ox + at.e * cw - 1, oy + at.l * ch - 1, cw + 1, ch + 1);
    }
    c.dataset.observed = grid.observed;
    if (age < FLASH_MS) scheduleDraw();
  }

  function describeCell(at) {
    if (!at) return;
    const i = at.l * grid.width + at.e;
    const code = grid.cells[i];
    if (code === CODE.NONE) { $('cell-info').textContent = 'Layer ' + at.l + ': no routed expert ' + at.e + ' (dense layer)'; return; }
    const routed = (grid.last[at.l] || []).includes(at.e);
    $('cell-info').textContent = 'Layer ' + at.l + ', expert ' + at.e + ': ' + NAMES[code] + ', routed to ' +
      fmtNum(grid.uses[i]) + ' times since load' + (routed ? '; used by the last token' : '');
  }

  function cellAt(ev) {
    const c = $('grid');
    const r = c.getBoundingClientRect();
    const x = (ev.clientX - r.left) * (c.width / r.width);
    const y = (ev.clientY - r.top) * (c.height / r.height);
    const e = Math.floor((x - grid.ox) / grid.cw);
    const l = Math.floor((y - grid.oy) / grid.ch);
    return e >= 0 && e < grid.width && l >= 0 && l < grid.layers ? { l, e } : null;
  }
  $('grid').addEventListener('mousemove', (ev) => {
    const at = cellAt(ev);
    grid.hover = at;
    if (at) describeCell(at);
    scheduleDraw();
  });
  $('grid').addEventListener('mouseleave', () => { grid.hover = null; scheduleDraw(); });
  $('grid').addEventListener('click', (ev) => {
    const at = cellAt(ev);
    if (at) { grid.cursor = at; describeCell(at); }
  });
  $('grid').addEventListener('focus', () => {
    if (!grid.cursor && grid.width) grid.cursor = { l: grid.layers > 1 && grid.cells[0] === CODE.NONE ? 1 : 0, e: 0 };
    describeCell(grid.cursor);
    scheduleDraw();
  });
  $('grid').addEventListener('blur', scheduleDraw);
  $('grid').addEventListener('keydown', (ev) => {
    if (!grid.width) return;
    const at = grid.cursor || { l: 0, e: 0 };
    const moves = {
      ArrowLeft: [0, -1], ArrowRight: [0, 1], ArrowUp: [-1, 0], ArrowDown: [1, 0],
      PageUp: [-8, 0], PageDown: [8, 0],
    };
    let { l, e } = at;
    if (moves[ev.key]) { l += moves[ev.key][0]; e += moves[ev.key][1]; }
    else if (ev.key === 'Home') e = 0;
    else if (ev.key === 'End') e = grid.width - 1;
    else return;
    ev.preventDefault();
    grid.cursor = { l: Math.min(grid.layers - 1, Math.max(0, l)), e: Math.min(grid.width - 1, Math.max(0, e)) };
    describeCell(grid.cursor);
    scheduleDraw();
  });

  // ---------------------------------------------------------------- statistics beside the grid
  const HISTORY = 120;
  const series = { hit: [], bpt: [], disk: [], tps: [] };
  let prevSample = null;

  function sample(model) {
    const c = model.cache;
    const now = performance.now();
    const s = { t: now, hits: c.hits, misses: c.misses, bytes: c.bytes_read, tokens: c.tokens, busy: c.disk_busy_seconds, out: model.tokens_generated };
    if (prevSample) {
      const dt = (s.t - prevSample.t) / 1000;
      const look = s.hits - prevSample.hits + s.misses - prevSample.misses;
      const dtok = s.tokens - prevSample.tokens;
      const dbytes = s.bytes - prevSample.bytes;
      const dbusy = s.busy - prevSample.busy;
      const dout = s.out - prevSample.out;
      if (look > 0) push('hit', (s.hits - prevSample.hits) / look);
      if (dtok > 0) push('bpt', dbytes / dtok);
      push('disk', dbusy > 0 ? dbytes / dbusy / 1e9 : 0);
      if (dt > 0) push('tps', dout / dt);
    }
    prevSample = s;
  }
  function push(name, v) {
    const a = series[name];
    a.push(v);
    if (a.length > HISTORY) a.shift();
  }
  function spark(id, values, fixedMax) {
    const c = $(id);
    const dpr = window.devicePixelRatio || 1;
    const w = Math.round(c.clientWidth * dpr) || c.width;
    const hgt = Math.round(c.clientHeight * dpr) || c.height;
    if (c.width !== w) c.width = w;
    if (c.height !== hgt) c.height = hgt;
    const ctx = c.getContext('2d');
    ctx.clearRect(0, 0, w, hgt);
    if (values.length < 2) return;
    const max = fixedMax || Math.max(...values) || 1;
    ctx.strokeStyle = '#7cc4ff';
    ctx.lineWidth = 1.5 * dpr;
    ctx.beginPath();
    values.forEach((v, k) => {
      const x = (k / (HISTORY - 1)) * w;
      const y = hgt - 2 * dpr - (Math.min(v, max) / max) * (hgt - 4 * dpr);
      if (k) ctx.lineTo(x, y); else ctx.moveTo(x, y);
    });
    ctx.stroke();
  }

  function renderStats(model, memory) {
    const c = model.cache;
    const last = (a) => (a.length ? a[a.length - 1] : NaN);
    if (c.streamed) {
      $('s-hit').textContent = fmtPct(c.hit_rate) + (series.hit.length ? ' (now ' + fmtPct(last(series.hit)) + ')' : '');
      $('s-bpt').textContent = fmtBytes(c.bytes_per_token) + '/token';
      $('s-disk').textContent = (c.disk_read_gb_per_s || 0).toFixed(2) + ' GB/s, ' + fmtBytes(c.bytes_read) + ' read';
      $('s-prefetch').textContent = c.predicted ? fmtPct(c.prefetch_recall) + ' / ' + fmtPct(c.prefetch_precision) : 'no predictions yet';
      $('s-cache').textContent = fmtNum(c.resident_experts) + ' of ' + fmtNum(c.capacity_experts) + ' experts held, ' +
        fmtBytes(c.used_bytes) + ' of ' + fmtBytes(c.budget_bytes) + (c.pinned_experts ? ', ' + c.pinned_experts + ' pinned' : '');
    } else {
      $('s-hit').textContent = 'all resident';
      $('s-bpt').textContent = '0 B/token (nothing read)';
      $('s-disk').textContent = 'not streamed';
      $('s-prefetch').textContent = 'not streamed';
      $('s-cache').textContent = 'every expert in RAM: ' + fmtNum(c.total_experts) + ' experts';
    }
    $('s-tps').textContent = series.tps.length ? last(series.tps).toFixed(1) + ' tok/s now' : '–';
    spark('k-hit', series.hit, 1);
    spark('k-bpt', series.bpt);
    spark('k-disk', series.disk);
    spark('k-tps', series.tps);
    renderMemory(memory);
  }

  function renderMemory(mem) {
    if (!mem || !mem.total_bytes) return;
    let weights = 0, experts = 0, kv = 0;
    for (const m of mem.models) { weights += m.resident_bytes; experts += m.expert_cache_bytes; kv += m.kv_bytes; }
    const total = mem.total_bytes;
    const free = mem.available_bytes;
    const other = Math.max(0, total - free - weights - experts - kv);
    const segs = [
      ['weights', 'resident weights', weights], ['experts', 'expert cache', experts], ['kv', 'KV cache', kv],
      ['other', 'other programs, page cache', other], ['free', 'available', free],
    ];
    const bar = $('membar');
    bar.replaceChildren(...segs.map(([k, label, v]) => {
      const s = h('span', { class: 'seg-' + k, title: label + ': ' + fmtBytes(v) });
      s.style.width = Math.max(0, (100 * v) / total).toFixed(3) + '%';
      return s;
    }));
    $('memlegend').replaceChildren(...segs.map(([k, label, v]) => h('li', {}, h('span', { class: 'sw seg-' + k }), label + ' ' + fmtBytes(v))),
      h('li', {}, 'of ' + fmtBytes(total) + '; colibrid ' + fmtBytes(mem.rss_bytes) + ' resident'));
  }

  // ---------------------------------------------------------------- the live stream
  const live = { controller: null, connected: false, retry: 500, model: null, paused: false };
  function restartLive() {
    if (live.paused) return;
    if (live.controller) live.controller.abort();
    live.controller = null;
    live.connected = false;
    prevSample = null;
    for (const k of Object.keys(series)) series[k] = [];
    if (state.model) runLive(state.model);
  }
  async function runLive(model) {
    const controller = new AbortController();
    live.controller = controller;
    live.model = model;
    try {
      const r = await api.request('GET', '/api/experts/events?model=' + encodeURIComponent(model), undefined, controller.signal);
      for await (const ev of sse(r)) {
        if (ev.event === 'snapshot') {
          live.connected = true;
          live.retry = 500;
          setConn(true);
          applySnapshot(ev.data);
          sample(ev.data.model);
          renderStats(ev.data.model, ev.data.memory);
        } else if (ev.event === 'delta') {
          applyDelta(ev.data.grid);
          sample(ev.data.model);
          renderStats(ev.data.model, ev.data.memory);
        } else if (ev.event === 'gone') {
          live.connected = false;
          refreshStatus();
          return;
        }
      }
    } catch (e) {
      if (controller.signal.aborted) return;
    }
    if (live.controller !== controller) return;
    live.connected = false;
    setConn(false, 'reconnecting…');
    setTimeout(() => { if (live.controller === controller) runLive(model); }, live.retry);
    live.retry = Math.min(10000, live.retry * 2);
  }

  // For debugging from the console (and the browser test): read-only views.
  window.colibri = Object.freeze({
    grid: () => ({ layers: grid.layers, experts: grid.width, cells: Array.from(grid.cells), uses: Array.from(grid.uses), last: grid.last, observed: grid.observed }),
    applySnapshot,
    applyDelta,
    renderReply: (text) => { const b = assistantBubble(); b.setText(text); return b.root.outerHTML; },
    stopLive: () => { live.paused = true; if (live.controller) live.controller.abort(); live.controller = null; },
  });

  newChat();
  refreshStatus();
})();
