/*
 * keep_dlopened.c — a library that tests preload into OpenMPI jobs (tests/CMakeLists.txt
 * CV_OPENMPI_TEST_ENV): dlclose does nothing, so every plugin OpenMPI opens stays mapped until the
 * process ends.
 *
 * Why: OpenMPI unloads its plugins (mca_*.so) in MPI_Finalize, and LeakSanitizer looks at the heap
 * after that. The plugins' process-lifetime allocations then come from "<unknown module>", which no
 * suppression can name, and the plugins have no frame pointers for the fast unwinder to reach
 * libmpi's frames. Whole-stack unwinding on every malloc did reach them, at about five times the
 * run time of every rank. With the plugins mapped, their frames keep their names and
 * lsan-openmpi.supp's "mca_" matches; cvllm's own stacks are unwound as everywhere else.
 *
 * Built without sanitizers: it is preloaded into mpirun and the Python test drivers as well.
 */
#include <dlfcn.h>

int dlclose(void *handle) {
    (void)handle;
    return 0;
}
