fn main() -> std::process::ExitCode {
    a2a_gateway::cli::run()
}
