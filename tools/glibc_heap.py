"""keep_freed_memory(): the PyTorch peers on the CPU keep freed memory as ShardTensor does.

ShardTensor's CLI and benchmarks call core/allocation_cache.hpp's keep_freed_memory(): glibc
keeps freed blocks of up to 1 GiB in the heap instead of unmapping them, so a step reuses warm
pages. A peer on glibc's defaults maps its large buffers afresh every step and pays the page
faults (on a VM whose faults are slow, more than the kernels: docs/performance.md, "PyTorch's
heap"). The same two mallopt values, set through ctypes.
"""
import ctypes

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
ONE_GIB = 1 << 30


def keep_freed_memory() -> None:
    """Sets glibc's mmap and trim thresholds to 1 GiB; raises where glibc refuses."""
    libc = ctypes.CDLL("libc.so.6")
    if not (libc.mallopt(M_MMAP_THRESHOLD, ONE_GIB) == 1 and
            libc.mallopt(M_TRIM_THRESHOLD, ONE_GIB) == 1):
        raise RuntimeError("glibc refused mallopt: this process cannot keep freed memory")


def add_heap_option(parser) -> None:
    """--heap keep|release on a PyTorch peer's command line (keep_heap applies it)."""
    parser.add_argument("--heap", choices=("keep", "release"), default="keep",
                        help="keep (on the CPU): freed memory stays in the heap, as "
                        "ShardTensor's benchmarks keep theirs; release: glibc's defaults (the "
                        "figures before 2026-12-06)")


def keep_heap(args, device: str = "cpu") -> None:
    """Keeps freed memory where --heap keep asks and the peer runs on the CPU (a GPU peer's
    tensors live in device memory: its host heap is left alone)."""
    if args.heap == "keep" and device == "cpu":
        keep_freed_memory()
