//! Prints the floor plan's import circles and over-long files (see the library); with
//! `--floors`, each crate's files by floor (0 = imports nothing of its crate).

fn main() {
    if std::env::args().any(|a| a == "--floors") {
        print!("{}", colibri_floor_plan::floors());
        return;
    }
    let circles = colibri_floor_plan::circle_report();
    let long = colibri_floor_plan::long_files();
    print!("{circles}");
    for f in &long {
        println!("over {} lines: {f}", colibri_floor_plan::MAX_LINES);
    }
    if circles.is_empty() && long.is_empty() {
        println!("floor plan: no import circle, no over-long file");
    } else {
        std::process::exit(1);
    }
}
