// jemalloc: glibc malloc cost a fifth of the request profile, and mimalloc, though as fast,
// keeps its free lists inside free blocks and so made the mostly untouched 8 KiB
// per-connection buffers of actix resident (22 KiB per open stream against 15 KiB here).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read at its start: a background thread gives freed memory back to
/// the system within about a second, so a burst (thousands of large bodies at once) leaves
/// no lasting footprint; without it memory is only returned while the allocator is busy.
/// The `_rjem_` prefix is tikv-jemallocator's; `Option<&u8>` has the layout of a C pointer.
#[export_name = "_rjem_malloc_conf"]
pub static MALLOC_CONF: Option<&'static u8> =
    Some(&b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:1000\0"[0]);

fn main() -> std::process::ExitCode {
    a2a_gateway::cli::run()
}
