/* Huge-page arenas for CPython's small-object allocator, for large simulations (sim/huge_pages.py).
 *
 * CPython's allocator (pymalloc) carves every object of up to 512 bytes out of 1 MiB "arenas" that it
 * maps from the system one at a time: 4 KiB pages. A 48P96D simulation keeps gigabytes of such objects
 * (requests, flows, heap entries, per-request records) and touches them all over, so many of its memory
 * accesses first miss the TLB and walk the page tables (under a hypervisor, both the guest's and the
 * host's). `install()` makes pymalloc take its arenas from regions of REGION_BYTES, aligned to 2 MiB and
 * advised MADV_HUGEPAGE, which the kernel backs with 2 MiB transparent huge pages when its THP setting is
 * `madvise` or `always` (with `never`, the regions are ordinary memory and nothing else changes).
 *
 * An arena pymalloc frees goes on a free list and is handed out again for its next arena; regions are
 * not returned to the system while the process lives (pymalloc itself frees an arena only once every
 * object in it is gone, rarely in a long run). Arenas of any other size, arenas mapped before
 * `install()` (freed with the allocator they came from) and arenas asked for when MAX_REGIONS regions
 * are in use all go to the allocator that was installed before.
 *
 * pymalloc calls its arena allocator with the GIL held, so the state below needs no lock. It is the
 * process's allocator state, like pymalloc's own: one per process, installed at most once.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <sys/mman.h>

#define HUGE_PAGE_BYTES ((size_t)2 << 20)
#define REGION_BYTES ((size_t)64 << 20)
#define MAX_REGIONS 4096 /* 256 GiB of arenas */

static PyObjectArenaAllocator previous;
static int installed = 0;
static size_t arena_bytes = 0;   /* the size of pymalloc's arenas: the first size asked for */
static char *region_starts[MAX_REGIONS];
static int num_regions = 0;
static char *next_free_byte = NULL; /* in the newest region */
static char *region_end = NULL;
static void *free_arenas = NULL;    /* freed arenas: each one's first word points to the next */
static Py_ssize_t arenas_cut = 0, arenas_reused = 0, arenas_freed = 0;

static int is_ours(const void *ptr)
{
    for (int i = 0; i < num_regions; i++) {
        if ((const char *)ptr >= region_starts[i] && (const char *)ptr < region_starts[i] + REGION_BYTES) {
            return 1;
        }
    }
    return 0;
}

/* A new region, 2 MiB-aligned (mapped 2 MiB larger, the unaligned ends unmapped again). */
static int new_region(void)
{
    if (num_regions == MAX_REGIONS) {
        return 0;
    }
    size_t mapped = REGION_BYTES + HUGE_PAGE_BYTES;
    char *raw = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
        return 0;
    }
    char *start = (char *)(((uintptr_t)raw + HUGE_PAGE_BYTES - 1) & ~(uintptr_t)(HUGE_PAGE_BYTES - 1));
    if (start > raw) {
        munmap(raw, (size_t)(start - raw));
    }
    size_t tail = (size_t)(raw + mapped - (start + REGION_BYTES));
    if (tail > 0) {
        munmap(start + REGION_BYTES, tail);
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(start, REGION_BYTES, MADV_HUGEPAGE); /* advice only: refused, the memory still works */
#endif
    region_starts[num_regions++] = start;
    next_free_byte = start;
    region_end = start + REGION_BYTES;
    return 1;
}

static void *arena_alloc(void *ctx, size_t size)
{
    (void)ctx;
    if (arena_bytes == 0) {
        arena_bytes = size;
    }
    if (size != arena_bytes || size > REGION_BYTES) {
        return previous.alloc(previous.ctx, size);
    }
    if (free_arenas != NULL) {
        void *arena = free_arenas;
        free_arenas = *(void **)arena;
        arenas_reused++;
        return arena;
    }
    if ((next_free_byte == NULL || (size_t)(region_end - next_free_byte) < size) && !new_region()) {
        return previous.alloc(previous.ctx, size);
    }
    void *arena = next_free_byte;
    next_free_byte += size;
    arenas_cut++;
    return arena;
}

static void arena_free(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    if (ptr != NULL && size == arena_bytes && is_ours(ptr)) {
        *(void **)ptr = free_arenas;
        free_arenas = ptr;
        arenas_freed++;
        return;
    }
    previous.free(previous.ctx, ptr, size);
}

static PyObject *install(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    if (!installed) {
        PyObjectArenaAllocator ours = {NULL, arena_alloc, arena_free};
        PyObject_GetArenaAllocator(&previous);
        PyObject_SetArenaAllocator(&ours);
        installed = 1;
    }
    Py_RETURN_NONE;
}

static PyObject *stats(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return Py_BuildValue("{s:O,s:n,s:n,s:n,s:n,s:n,s:n}", "installed", installed ? Py_True : Py_False,
                         "arena_bytes", (Py_ssize_t)arena_bytes, "region_bytes", (Py_ssize_t)REGION_BYTES,
                         "regions", (Py_ssize_t)num_regions, "arenas_cut", arenas_cut,
                         "arenas_reused", arenas_reused, "arenas_freed", arenas_freed);
}

static PyMethodDef methods[] = {
    {"install", install, METH_NOARGS, "Take pymalloc's arenas from huge-page regions from now on (idempotent)."},
    {"stats", stats, METH_NOARGS, "Whether installed; arena and region sizes; regions mapped; arenas cut, reused, freed."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_huge_arenas", NULL, -1, methods};

PyMODINIT_FUNC PyInit__huge_arenas(void)
{
    return PyModule_Create(&module);
}
