/* Ranks that disagree about one collective must all get an MPI error
 * (under MPI_ERRORS_RETURN) within GPUCOLL_TIMEOUT, never hang; afterwards
 * the communicator it happened on keeps reporting an error on every call,
 * and every other communicator (made before or after) keeps working.
 *
 * These programs are erroneous MPI, so what plain MPI does with them is
 * undefined (it may hang): the disagreements run only where gpucoll_mpi
 * routes the buffers to gpucoll (preloaded or linked, with
 * GPUCOLL_SHIM_HOST=1 for host buffers, or --device); elsewhere only the
 * checks of working communicators run. The cases, each on a fresh
 * duplicate of MPI_COMM_WORLD:
 *   route, type: rank 0 passes MPI_SHORT (gpucoll has no 16-bit integers:
 *     staged to MPI), the others MPI_INT (gpucoll);
 *   route, op: rank 0 passes a user op (staged), the others MPI_SUM;
 *   route, root: in MPI_Bcast rank 0 passes a root out of range (MPI
 *     reports it at once), the others root 0 (gpucoll, waiting for rank 0's
 *     data);
 *   route, memory (--device): rank 0 passes host memory, the others device
 *     memory;
 *   nonblocking, op: as "op" with MPI_Iallreduce, the error at MPI_Wait;
 *   first call, count: a duplicate's first collective with count 5 on rank
 *     0 and 7 elsewhere (the handshake that creates gpucoll's communicator
 *     compares the calls: MPI_ERR_NOT_SAME at once).
 * Every case but the first-call one starts with one agreeing collective on
 * the duplicate (which creates gpucoll's communicator on it).
 *
 * With GPUCOLL_SHIM_PANIC (gpucoll_mpi's test hook: the calls it names
 * panic inside the library) the program checks instead that each of
 * MPI_Bcast, MPI_Iallreduce, MPI_Send and MPI_Wait that it names returns an
 * error of class MPI_ERR_INTERN (a nonblocking one leaves MPI_REQUEST_NULL)
 * and that the program goes on. */
#include "shimtest.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 64

static double timeout_s = 300;
static MPI_Comm before; /* made before any failure; must keep working */
/* The program's own bookkeeping: only MPI_Barrier and 16-bit integers,
 * which gpucoll does not take, so this communicator never runs under
 * GPUCOLL_TIMEOUT (after a failure ranks are up to a timeout apart). */
static MPI_Comm book;

/* The logical and (`or` 0) or or (1) of `mine` over all ranks. */
static int all_ranks(int mine, int or)
{
    short m = (short)(mine != 0), r = 0;
    MPI_Barrier(book);
    MPI_Allreduce(&m, &r, 1, MPI_SHORT, or ? MPI_MAX : MPI_MIN, book);
    return r;
}

static void sum_ints(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    for (int i = 0; i < *len; i++)
        ((int *)inout)[i] += ((int *)in)[i];
}

/* An Allreduce of N ints on `comm` with correct results (on device buffers
 * with --device, host buffers otherwise). */
static int works(MPI_Comm comm, const char *what)
{
    int np;
    MPI_Comm_size(comm, &np);
    struct st_buf a = st_buf_new(N * sizeof(int)), b = st_buf_poisoned(N * sizeof(int));
    for (int i = 0; i < N; i++)
        ((int *)a.host)[i] = i + 3 * st.rank;
    st_push(&a);
    char label[200];
    snprintf(label, sizeof label, "Allreduce on %s", what);
    int ok = st_ok(MPI_Allreduce(a.mpi, b.mpi, N, MPI_INT, MPI_SUM, comm), label);
    if (ok) {
        st_pull(&b);
        int base = 3 * np * (np - 1) / 2;
        for (int i = 0; i < N && ok; i++) {
            if (((int *)b.host)[i] != np * i + base) {
                st_fail("%s: [%d] got %d want %d", label, i, ((int *)b.host)[i], np * i + base);
                ok = 0;
            }
        }
        if (ok)
            st_pass();
    }
    st_buf_free(&a);
    st_buf_free(&b);
    return ok;
}

/* Other communicators keep working: one made before the failures, world,
 * and a new duplicate; point-to-point on world too. */
static void others_work(const char *after)
{
    char what[160];
    MPI_Barrier(book);
    snprintf(what, sizeof what, "MPI_COMM_WORLD after %s", after);
    works(MPI_COMM_WORLD, what);
    snprintf(what, sizeof what, "a duplicate made before the failures, after %s", after);
    works(before, what);
    MPI_Comm fresh;
    MPI_Comm_dup(MPI_COMM_WORLD, &fresh);
    MPI_Comm_set_errhandler(fresh, MPI_ERRORS_RETURN);
    snprintf(what, sizeof what, "a new duplicate after %s", after);
    works(fresh, what);
    MPI_Comm_free(&fresh);
    int token = st.rank, got = -1;
    int next = (st.rank + 1) % st.size, prev = (st.rank + st.size - 1) % st.size;
    snprintf(what, sizeof what, "Sendrecv on MPI_COMM_WORLD after %s", after);
    if (st_ok(MPI_Sendrecv(&token, 1, MPI_INT, next, 5, &got, 1, MPI_INT, prev, 5, MPI_COMM_WORLD,
                           MPI_STATUS_IGNORE),
              what)) {
        if (got == prev)
            st_pass();
        else
            st_fail("%s: got %d want %d", what, got, prev);
    }
}

/* Every rank must have seen an error (`mine`), within the time limit. */
static void everyone_failed(const char *name, int mine, double seconds)
{
    int late = seconds > 3 * timeout_s + 15;
    int all = all_ranks(mine, 0), any_late = all_ranks(late, 1);
    if (!mine)
        st_fail("%s: rank %d got no error", name, st.rank);
    else if (late)
        st_fail("%s: rank %d got its error after %.1f s (GPUCOLL_TIMEOUT %.1f s)", name, st.rank,
                seconds, timeout_s);
    else if (all && !any_late)
        st_pass();
    if (st.rank == 0 && st.verbose)
        printf("%s: every rank failed: %s\n", name, all ? "yes" : "no");
}

/* After a failure, the communicator keeps reporting: the next two calls on
 * it (blocking and nonblocking) fail on every rank, and leave no request. */
static void keeps_failing(const char *name, MPI_Comm c)
{
    struct st_buf a = st_buf_new(N * sizeof(int)), b = st_buf_new(N * sizeof(int));
    memset(a.host, 0, N * sizeof(int));
    st_push(&a);
    char what[200];
    int rc = MPI_Allreduce(a.mpi, b.mpi, N, MPI_INT, MPI_SUM, c);
    snprintf(what, sizeof what, "%s: the failed communicator's next Allreduce", name);
    everyone_failed(what, rc != MPI_SUCCESS, 0);
    MPI_Request r = MPI_REQUEST_NULL;
    rc = MPI_Ibcast(a.mpi, N, MPI_INT, 0, c, &r);
    snprintf(what, sizeof what, "%s: the failed communicator's next Ibcast", name);
    everyone_failed(what, rc != MPI_SUCCESS, 0);
    if (rc != MPI_SUCCESS && r != MPI_REQUEST_NULL)
        st_fail("%s: a failed Ibcast returned a request", name);
    else if (rc == MPI_SUCCESS)
        MPI_Wait(&r, MPI_STATUS_IGNORE);
    st_buf_free(&a);
    st_buf_free(&b);
}

/* A fresh duplicate; with `warm`, after one agreeing collective on it. */
static MPI_Comm fresh_comm(int warm, const char *name)
{
    MPI_Comm c;
    MPI_Barrier(book);
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    if (warm) {
        char what[160];
        snprintf(what, sizeof what, "%s: the agreeing call first", name);
        works(c, what);
    }
    return c;
}

enum kind { TYPE, OP, ROOT, MEMORY, NONBLOCKING, FIRST_COUNT };
static const char *names[] = {"route, type",    "route, op",    "route, root",
                              "route, memory",  "nonblocking, op", "first call, count"};

static void disagree(enum kind k)
{
    const char *name = names[k];
    MPI_Comm c = fresh_comm(k != FIRST_COUNT, name);
    int odd = st.rank == 0;
    MPI_Op user;
    MPI_Op_create(sum_ints, 1, &user);
    struct st_buf a = st_buf_new(N * sizeof(int)), b = st_buf_new(N * sizeof(int));
    struct st_buf ha = st_buf_new_host(N * sizeof(int)), hb = st_buf_new_host(N * sizeof(int));
    memset(a.host, 0, N * sizeof(int));
    st_push(&a);
    memset(ha.mpi, 0, N * sizeof(int));
    double t0 = MPI_Wtime();
    int rc = MPI_SUCCESS;
    MPI_Request r = MPI_REQUEST_NULL;
    switch (k) {
    case TYPE:
        rc = MPI_Allreduce(a.mpi, b.mpi, odd ? 2 * N : N, odd ? MPI_SHORT : MPI_INT, MPI_SUM, c);
        break;
    case OP:
        rc = MPI_Allreduce(a.mpi, b.mpi, N, MPI_INT, odd ? user : MPI_SUM, c);
        break;
    case ROOT:
        rc = MPI_Bcast(a.mpi, N, MPI_INT, odd ? st.size + 2 : 0, c);
        break;
    case MEMORY:
        rc = MPI_Allreduce(odd ? ha.mpi : a.mpi, odd ? hb.mpi : b.mpi, N, MPI_INT, MPI_SUM, c);
        break;
    case NONBLOCKING:
        rc = MPI_Iallreduce(a.mpi, b.mpi, N, MPI_INT, odd ? user : MPI_SUM, c, &r);
        if (rc == MPI_SUCCESS)
            rc = MPI_Wait(&r, MPI_STATUS_IGNORE);
        else if (r != MPI_REQUEST_NULL)
            st_fail("%s: a failed Iallreduce returned a request", name);
        break;
    case FIRST_COUNT:
        rc = MPI_Allreduce(a.mpi, b.mpi, odd ? 5 : 7, MPI_INT, MPI_SUM, c);
        break;
    }
    double t = MPI_Wtime() - t0;
    everyone_failed(name, rc != MPI_SUCCESS, t);
    if (k == FIRST_COUNT) {
        int cls = -1;
        MPI_Error_class(rc, &cls);
        if (cls == MPI_ERR_NOT_SAME)
            st_pass();
        else
            st_fail("%s: error class %d, want MPI_ERR_NOT_SAME (%d)", name, cls, MPI_ERR_NOT_SAME);
    }
    keeps_failing(name, c);
    others_work(name);
    MPI_Op_free(&user);
    MPI_Comm_free(&c);
    st_buf_free(&a);
    st_buf_free(&b);
    st_buf_free(&ha);
    st_buf_free(&hb);
}

static void expect_intern(int rc, const char *what)
{
    int cls = -1;
    if (rc != MPI_SUCCESS)
        MPI_Error_class(rc, &cls);
    if (cls == MPI_ERR_INTERN)
        st_pass();
    else
        st_fail("%s: returned %d (class %d), want MPI_ERR_INTERN", what, rc, cls);
}

static void panics(const char *list)
{
    struct st_buf a = st_buf_new(N * sizeof(int)), b = st_buf_new(N * sizeof(int));
    memset(a.host, 0, N * sizeof(int));
    st_push(&a);
    if (strstr(list, "MPI_Bcast"))
        expect_intern(MPI_Bcast(a.mpi, N, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Bcast that panics");
    if (strstr(list, "MPI_Iallreduce")) {
        MPI_Request r = MPI_REQUEST_NULL;
        expect_intern(MPI_Iallreduce(a.mpi, b.mpi, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &r),
                      "MPI_Iallreduce that panics");
        if (r != MPI_REQUEST_NULL)
            st_fail("an MPI_Iallreduce that panicked returned a request");
    }
    if (strstr(list, "MPI_Send"))
        expect_intern(MPI_Send(a.mpi, 1, MPI_INT, (st.rank + 1) % st.size, 3, MPI_COMM_WORLD),
                      "MPI_Send that panics");
    if (strstr(list, "MPI_Wait")) {
        MPI_Request r = MPI_REQUEST_NULL;
        expect_intern(MPI_Wait(&r, MPI_STATUS_IGNORE), "MPI_Wait that panics");
    }
    /* the program goes on */
    works(MPI_COMM_WORLD, "MPI_COMM_WORLD after the panics");
    works(before, "a duplicate after the panics");
    st_buf_free(&a);
    st_buf_free(&b);
}

/* Whether gpucoll_mpi routes this program's buffers to gpucoll. */
static int shim_routes(void)
{
    const char *off = getenv("GPUCOLL_SHIM"), *host = getenv("GPUCOLL_SHIM_HOST");
    if (!dlsym(RTLD_DEFAULT, "gpucoll_shim_allreduce_native") || (off && !strcmp(off, "0")))
        return 0;
    return st.device || (host && *host && strcmp(host, "0") != 0);
}

int main(int argc, char **argv)
{
    st_init(&argc, &argv, "failure");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    const char *t = getenv("GPUCOLL_TIMEOUT");
    if (t && atof(t) > 0)
        timeout_s = atof(t);
    MPI_Comm_dup(MPI_COMM_WORLD, &book);
    MPI_Comm_dup(MPI_COMM_WORLD, &before);
    MPI_Comm_set_errhandler(before, MPI_ERRORS_RETURN);
    works(before, "a duplicate before the failures");
    const char *panic_list = getenv("GPUCOLL_SHIM_PANIC");
    if (panic_list && *panic_list && shim_routes()) {
        panics(panic_list);
    } else if (st.size < 2 || !shim_routes()) {
        if (st.rank == 0)
            printf("failure: %s: only the checks of working communicators run\n",
                   st.size < 2 ? "one rank" : "gpucoll_mpi does not route these buffers");
        others_work("nothing");
    } else {
        disagree(FIRST_COUNT);
        disagree(TYPE);
        disagree(OP);
        disagree(ROOT);
        if (st.device)
            disagree(MEMORY);
        disagree(NONBLOCKING);
    }
    MPI_Comm_free(&before);
    MPI_Barrier(book);
    MPI_Comm_free(&book);
    return st_finish();
}
