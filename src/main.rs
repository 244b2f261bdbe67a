// jemalloc: glibc malloc cost a fifth of the request profile, and mimalloc, though as fast,
// keeps its free lists inside free blocks and so made the mostly untouched 8 KiB
// per-connection buffers of actix resident (22 KiB per open stream against 15 KiB here).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    a2a_gateway::cli::run()
}
