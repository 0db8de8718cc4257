fn main() {
    std::process::exit(zeta::cli::main());
}
