fn main() { eprintln!("colibrid: not built yet"); std::process::exit(2); }
