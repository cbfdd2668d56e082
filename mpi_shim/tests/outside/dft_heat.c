/* An MPI program written without the shim in mind, for the "outside" check:
 * its output must be byte-identical with and without the shim, whatever the
 * routing. It does its own things on host buffers:
 *   1. a 2D discrete Fourier transform over the integers modulo the prime
 *      p = 15 * 2^27 + 1 on an L x L matrix distributed by rows: transform
 *      the rows, transpose with MPI_Alltoall, transform again, transpose
 *      back; then the inverse, which must give the input back;
 *   2. a 1D heat equation with fixed-point-exact doubles (halo exchange with
 *      MPI_Sendrecv, conserved total and largest change by MPI_Allreduce);
 *   3. bookkeeping with MPI_Bcast, MPI_Scatter, MPI_Gather, MPI_Allgatherv,
 *      MPI_Reduce, MPI_Scan and an MPI_Iallreduce overlapped with work.
 * Rank 0 prints everything; all arithmetic is exact, so any reduction order
 * gives the same bits. Works on 1, 2, 3, 4, 6, 8, 12, 16, 24 or 48 ranks. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define P 2013265921ull /* 15 * 2^27 + 1; 31 generates its multiplicative group */
#define L 48           /* divides p - 1, and is divisible by 1..4 */

static int rank, size, failed;

static uint64_t pw(uint64_t b, uint64_t e)
{
    uint64_t r = 1;
    b %= P;
    while (e) {
        if (e & 1)
            r = r * b % P;
        b = b * b % P;
        e >>= 1;
    }
    return r;
}

/* Transform each of `rows` rows of length L in place with root w. */
static void dft_rows(uint32_t *m, int rows, uint64_t w)
{
    uint64_t tw[L], out[L];
    for (int k = 0; k < L; k++)
        tw[k] = pw(w, (uint64_t)k);
    for (int r = 0; r < rows; r++) {
        uint32_t *row = m + (size_t)r * L;
        for (int k = 0; k < L; k++) {
            uint64_t acc = 0;
            for (int j = 0; j < L; j++)
                acc = (acc + (uint64_t)row[j] * tw[(size_t)j * k % L]) % P;
            out[k] = acc;
        }
        for (int k = 0; k < L; k++)
            row[k] = (uint32_t)out[k];
    }
}

/* Distributed transpose of an L x L matrix held as rows/size rows per rank. */
static void transpose(uint32_t *m, uint32_t *tmp)
{
    int rows = L / size, blk = rows * rows;
    /* pack: block d holds my rows' columns of rank d's rows */
    for (int d = 0; d < size; d++)
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < rows; c++)
                tmp[d * blk + r * rows + c] = m[r * L + d * rows + c];
    MPI_Alltoall(tmp, blk, MPI_UINT32_T, m, blk, MPI_UINT32_T, MPI_COMM_WORLD);
    memcpy(tmp, m, sizeof(uint32_t) * (size_t)rows * L);
    /* unpack: from rank s the block (its rows) x (my rows), transposed */
    for (int s = 0; s < size; s++)
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < rows; c++)
                m[c * L + s * rows + r] = tmp[s * blk + r * rows + c];
}

static void dft2d(uint32_t *m, uint32_t *tmp, uint64_t w)
{
    int rows = L / size;
    dft_rows(m, rows, w);
    transpose(m, tmp);
    dft_rows(m, rows, w);
    transpose(m, tmp);
}

static void part_dft(void)
{
    int rows = L / size;
    uint32_t seed = 0;
    if (rank == 0)
        seed = 20261130u;
    MPI_Bcast(&seed, 1, MPI_UINT32_T, 0, MPI_COMM_WORLD);
    uint32_t *m = malloc(sizeof(uint32_t) * rows * L), *orig = malloc(sizeof(uint32_t) * rows * L);
    uint32_t *tmp = malloc(sizeof(uint32_t) * rows * L);
    uint64_t x = seed;
    for (int i = 0; i < rank * rows * L; i++) /* the same global matrix for any rank count */
        x = (x * 6364136223846793005ull + 1442695040888963407ull);
    for (int i = 0; i < rows * L; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        m[i] = orig[i] = (uint32_t)((x >> 33) % P);
    }
    uint64_t w = pw(31, (P - 1) / L);
    dft2d(m, tmp, w);
    /* digests of the spectrum */
    uint64_t sum = 0, mx = 0, x_or = 0;
    for (int i = 0; i < rows * L; i++) {
        sum += m[i];
        mx = m[i] > mx ? m[i] : mx;
        x_or ^= (uint64_t)m[i] << ((rank * rows * L + i) % 29);
    }
    uint64_t gsum = 0, gmax = 0, gxor = 0;
    MPI_Reduce(&sum, &gsum, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Allreduce(&mx, &gmax, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&x_or, &gxor, 1, MPI_UINT64_T, MPI_BXOR, MPI_COMM_WORLD);
    uint32_t *first = rank == 0 ? malloc(sizeof(uint32_t) * L * size) : NULL;
    MPI_Gather(m, L, MPI_UINT32_T, first, L, MPI_UINT32_T, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("dft: L=%d sum=%llu max=%llu xor=%016llx\n", L, (unsigned long long)gsum,
               (unsigned long long)gmax, (unsigned long long)gxor);
        for (int s = 0; s < size; s++)
            printf("dft: spectrum row %d: %u %u %u ... %u\n", s * rows, first[s * L],
                   first[s * L + 1], first[s * L + 2], first[s * L + L - 1]);
    }
    free(first);
    /* inverse: root w^-1 and a factor L^-2 (L^-1 per dimension) */
    dft2d(m, tmp, pw(w, P - 2));
    uint64_t inv_l = pw((uint64_t)L * L, P - 2);
    int wrong = 0, all_wrong = 0;
    for (int i = 0; i < rows * L; i++)
        wrong += (uint32_t)((uint64_t)m[i] * inv_l % P) != orig[i];
    MPI_Allreduce(&wrong, &all_wrong, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("dft: inverse gives the input back: %s (%d wrong)\n", all_wrong ? "NO" : "yes",
               all_wrong);
    failed |= all_wrong != 0;
    free(m);
    free(orig);
    free(tmp);
}

/* u_new[i] = (u[i-1] + 2 u[i] + u[i+1]) / 4 on a ring: with integer starting
 * values below 2^10 and 8 steps every value is a multiple of 2^-16 below
 * 2^10, so every sum here is exact in double. */
static void part_heat(void)
{
    int cells[2] = {0, 0}; /* per rank, and steps; rank 0 decides */
    if (rank == 0) {
        int *plan = malloc(sizeof(int) * 2 * size);
        for (int r = 0; r < size; r++) {
            plan[2 * r] = 16 + 3 * r;
            plan[2 * r + 1] = 8;
        }
        MPI_Scatter(plan, 2, MPI_INT, cells, 2, MPI_INT, 0, MPI_COMM_WORLD);
        free(plan);
    } else {
        MPI_Scatter(NULL, 2, MPI_INT, cells, 2, MPI_INT, 0, MPI_COMM_WORLD);
    }
    int n = cells[0], steps = cells[1], offset = 0;
    MPI_Scan(&n, &offset, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    offset -= n;
    double *u = calloc((size_t)n + 2, sizeof(double)), *v = calloc((size_t)n + 2, sizeof(double));
    for (int i = 0; i < n; i++)
        u[i + 1] = (double)(((offset + i) * 37) % 1000);
    int left = (rank + size - 1) % size, right = (rank + 1) % size;
    for (int s = 0; s < steps; s++) {
        MPI_Sendrecv(&u[1], 1, MPI_DOUBLE, left, 1, &u[n + 1], 1, MPI_DOUBLE, right, 1,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Sendrecv(&u[n], 1, MPI_DOUBLE, right, 2, &u[0], 1, MPI_DOUBLE, left, 2,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        double change = 0, local[2] = {0, 0}, total[2];
        for (int i = 1; i <= n; i++) {
            v[i] = (u[i - 1] + 2 * u[i] + u[i + 1]) / 4;
            double d = v[i] > u[i] ? v[i] - u[i] : u[i] - v[i];
            change = d > change ? d : change;
            local[0] += v[i];
        }
        local[1] = -change;
        /* an overlapped reduction of the heat while the next state is copied */
        MPI_Request req;
        MPI_Iallreduce(local, total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &req);
        memcpy(&u[1], &v[1], sizeof(double) * n);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        double gmax = 0;
        MPI_Allreduce(&change, &gmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (rank == 0)
            printf("heat: step %d total %.17g largest change %.17g\n", s, total[0], gmax);
    }
    /* everybody's cells at rank 0, in order */
    int *counts = malloc(sizeof(int) * size), *displs = malloc(sizeof(int) * size);
    MPI_Allgather(&n, 1, MPI_INT, counts, 1, MPI_INT, MPI_COMM_WORLD);
    int all = 0;
    for (int r = 0; r < size; r++) {
        displs[r] = all;
        all += counts[r];
    }
    double *field = malloc(sizeof(double) * all);
    MPI_Allgatherv(&u[1], n, MPI_DOUBLE, field, counts, displs, MPI_DOUBLE, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("heat: %d cells; every 7th:", all);
        for (int i = 0; i < all; i += 7)
            printf(" %.17g", field[i]);
        printf("\n");
    }
    free(field);
    free(counts);
    free(displs);
    free(u);
    free(v);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (L % size != 0) {
        if (rank == 0)
            fprintf(stderr, "dft_heat: the rank count must divide %d\n", L);
        MPI_Finalize();
        return 2;
    }
    part_dft();
    part_heat();
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        printf("done on %d ranks\n", size);
    MPI_Finalize();
    return failed;
}
