use std::process::ExitCode;

fn main() -> ExitCode {
    colibri_daemon::server::main()
}
