/*
 * allreduce.c — the all-reduce of tensor parallelism, as one MPI_Allreduce against its reduce-scatter
 * + all-gather decomposition (MPI_Reduce_scatter_block then MPI_Allgather: what vLLM-Ascend's
 * FlashComm_v1 does around the norm, so that each rank norms only its share of the tokens), on the
 * sizes a Qwen3 layer all-reduces: hidden × tokens f32, from one decoded token of Qwen3-0.6B (4 KiB)
 * to a 4096-token prefill chunk of Qwen3-32B (80 MiB would be off the chart; 16 MiB is shown).
 *
 * Each size runs `reps` times per method, three passes, and the best pass is reported (the machines
 * this runs on are shared), in µs per all-reduce and as the ratio decomposition / MPI_Allreduce.
 *
 * Build: mpicc -O2 bench/allreduce.c -o allreduce
 * Run:   mpirun -np 2 --oversubscribe --bind-to none ./allreduce   (as root: --allow-run-as-root)
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static double time_method(int rs_ag, float *x, float *part, int count, int ranks, int reps) {
    double best = 1e30;
    for (int pass = 0; pass < 3; pass++) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        for (int r = 0; r < reps; r++) {
            if (!rs_ag) {
                MPI_Allreduce(MPI_IN_PLACE, x, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                continue;
            }
            MPI_Reduce_scatter_block(x, part, count / ranks, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            MPI_Allgather(part, count / ranks, MPI_FLOAT, x, count / ranks, MPI_FLOAT, MPI_COMM_WORLD);
        }
        double t = (MPI_Wtime() - t0) / reps, slowest;
        MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); /* a collective ends on its last rank */
        if (slowest < best) best = slowest;
    }
    return best;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, ranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    if (rank == 0) printf("%d ranks\n%12s %10s %14s %10s %8s\n", ranks, "floats", "KiB", "MPI_Allreduce", "RS+AG", "ratio");
    for (int count = 1024; count <= 4 << 20; count *= 4) {
        float *x = calloc((size_t)count, sizeof *x), *part = calloc((size_t)count / (size_t)ranks + 1, sizeof *part);
        const int reps = count >= 1 << 20 ? 30 : 300;
        const double ar = time_method(0, x, part, count, ranks, reps), rsag = time_method(1, x, part, count, ranks, reps);
        if (rank == 0)
            printf("%12d %10d %12.1f µs %7.1f µs %7.2f×\n", count, count / 256, ar * 1e6, rsag * 1e6, rsag / ar);
        free(x);
        free(part);
    }
    MPI_Finalize();
    return 0;
}
