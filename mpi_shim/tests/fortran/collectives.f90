! Every collective the gpucoll MPI shim intercepts, through mpif.h (Open MPI's
! mpi_xxx_ entry points), with exact expected values: integer and real*8 data,
! MPI_IN_PLACE, count 0, a prime count, the nonblocking forms and every completion
! call (also on arrays mixing collective and point-to-point requests).
! Build: mpif90 -fallow-argument-mismatch (gfortran >= 10 rejects mpif.h programs
! passing buffers of several types otherwise). Run with any number of ranks; rank 0
! prints "N passed, M failed" (N depends only on the rank count) and the program
! stops with a nonzero code on any failure.
program collectives
  implicit none
  include 'mpif.h'
  integer, parameter :: k = 7
  integer :: rank, nproc, ierr, npass, nfail, totals(2)

  npass = 0
  nfail = 0
  call MPI_Init(ierr)
  call check(ierr == MPI_SUCCESS, 'MPI_Init ierror')
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nproc, ierr)

  call test_allreduce()
  call test_reduce()
  call test_bcast()
  call test_allgather()
  call test_reduce_scatter()
  call test_alltoall()
  call test_gather_scatter()
  call test_vector_forms()
  call test_nonblocking_wait()
  call test_nonblocking_test()
  call test_request_free_cancel()

  call MPI_Barrier(MPI_COMM_WORLD, ierr)
  call check(ierr == MPI_SUCCESS, 'barrier')
  totals = (/ npass, nfail /)
  call MPI_Allreduce(MPI_IN_PLACE, totals, 2, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  if (rank == 0) print '(I0," passed, ",I0," failed")', totals(1), totals(2)
  call MPI_Finalize(ierr)
  if (totals(2) /= 0) stop 1

contains

  subroutine check(ok, what)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: what
    if (ok) then
      npass = npass + 1
    else
      nfail = nfail + 1
      print '("rank ",I0," FAILED: ",A)', rank, what
    end if
  end subroutine check

  ! Sum over ranks of (r + 1), n (n + 1) / 2.
  integer function tri()
    tri = nproc * (nproc + 1) / 2
  end function tri

  subroutine test_allreduce()
    integer :: isend(k), irecv(k), bits, j
    double precision :: dbuf(k)
    do j = 1, k
      isend(j) = rank + j
      dbuf(j) = (rank + 1) * j * 0.5d0
    end do
    call MPI_Allreduce(isend, irecv, k, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
    call check(ierr == MPI_SUCCESS .and. all(irecv == (/ (nproc * j + nproc * (nproc - 1) / 2, j = 1, k) /)), &
               'allreduce integer sum')
    call MPI_Allreduce(MPI_IN_PLACE, dbuf, k, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
    call check(all(dbuf == (/ (j * 0.5d0 * tri(), j = 1, k) /)), 'allreduce real*8 sum in place')
    call MPI_Allreduce(isend, irecv, k, MPI_INTEGER, MPI_MAX, MPI_COMM_WORLD, ierr)
    call check(all(irecv == (/ (nproc - 1 + j, j = 1, k) /)), 'allreduce integer max')
    call MPI_Allreduce(isend, irecv, k, MPI_INTEGER, MPI_MIN, MPI_COMM_WORLD, ierr)
    call check(all(irecv == (/ (j, j = 1, k) /)), 'allreduce integer min')
    bits = 2 ** rank
    call MPI_Allreduce(MPI_IN_PLACE, bits, 1, MPI_INTEGER, MPI_BOR, MPI_COMM_WORLD, ierr)
    call check(bits == 2 ** nproc - 1, 'allreduce integer bor in place')
    irecv = -5
    call MPI_Allreduce(isend, irecv, 0, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
    call check(ierr == MPI_SUCCESS .and. all(irecv == -5), 'allreduce count 0')
  end subroutine test_allreduce

  subroutine test_reduce()
    integer :: isend(k), irecv(k), j, root
    double precision :: dbuf(k)
    root = nproc - 1
    isend = (/ (rank * j, j = 1, k) /)
    irecv = 0
    call MPI_Reduce(isend, irecv, k, MPI_INTEGER, MPI_SUM, root, MPI_COMM_WORLD, ierr)
    if (rank == root) call check(all(irecv == (/ (j * nproc * (nproc - 1) / 2, j = 1, k) /)), 'reduce integer sum')
    dbuf = (/ (dble(rank + j), j = 1, k) /)
    if (rank == 0) then
      call MPI_Reduce(MPI_IN_PLACE, dbuf, k, MPI_DOUBLE_PRECISION, MPI_MAX, 0, MPI_COMM_WORLD, ierr)
      call check(all(dbuf == (/ (dble(nproc - 1 + j), j = 1, k) /)), 'reduce real*8 max in place')
    else
      call MPI_Reduce(dbuf, dbuf, k, MPI_DOUBLE_PRECISION, MPI_MAX, 0, MPI_COMM_WORLD, ierr)
    end if
  end subroutine test_reduce

  subroutine test_bcast()
    integer :: ibuf(k), j
    double precision :: dbuf(k)
    ibuf = -1
    if (rank == 0) ibuf = (/ (100 + j, j = 1, k) /)
    call MPI_Bcast(ibuf, k, MPI_INTEGER, 0, MPI_COMM_WORLD, ierr)
    call check(all(ibuf == (/ (100 + j, j = 1, k) /)), 'bcast integer')
    dbuf = 0d0
    if (rank == nproc - 1) dbuf = (/ (j * 0.25d0, j = 1, k) /)
    call MPI_Bcast(dbuf, k, MPI_DOUBLE_PRECISION, nproc - 1, MPI_COMM_WORLD, ierr)
    call check(all(dbuf == (/ (j * 0.25d0, j = 1, k) /)), 'bcast real*8')
  end subroutine test_bcast

  subroutine test_allgather()
    integer :: isend(k), j, r
    integer, allocatable :: irecv(:)
    double precision, allocatable :: dbuf(:)
    allocate(irecv(k * nproc), dbuf(k * nproc))
    isend = (/ (rank * 10 + j, j = 1, k) /)
    call MPI_Allgather(isend, k, MPI_INTEGER, irecv, k, MPI_INTEGER, MPI_COMM_WORLD, ierr)
    call check(all(irecv == (/ ((r * 10 + j, j = 1, k), r = 0, nproc - 1) /)), 'allgather integer')
    dbuf = -1d0
    dbuf(rank * k + 1:rank * k + k) = (/ (rank + j * 0.5d0, j = 1, k) /)
    call MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, dbuf, k, MPI_DOUBLE_PRECISION, MPI_COMM_WORLD, ierr)
    call check(all(dbuf == (/ ((r + j * 0.5d0, j = 1, k), r = 0, nproc - 1) /)), 'allgather real*8 in place')
  end subroutine test_allgather

  subroutine test_reduce_scatter()
    integer :: j, b
    integer, allocatable :: counts(:), isend(:), irecv(:)
    double precision, allocatable :: dsend(:)
    double precision :: drecv(k)
    allocate(dsend(k * nproc))
    dsend = (/ ((dble(rank + b + j), j = 1, k), b = 1, nproc) /)
    call MPI_Reduce_scatter_block(dsend, drecv, k, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
    call check(all(drecv == (/ (dble(nproc * (nproc - 1) / 2 + nproc * (rank + 1 + j)), j = 1, k) /)), &
               'reduce_scatter_block real*8 sum')
    call MPI_Reduce_scatter_block(MPI_IN_PLACE, dsend, k, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
    call check(all(dsend(1:k) == (/ (dble(nproc * (nproc - 1) / 2 + nproc * (rank + 1 + j)), j = 1, k) /)), &
               'reduce_scatter_block real*8 in place')
    ! Block b (of b + 1 elements) goes to rank b.
    allocate(counts(nproc), isend(tri()), irecv(rank + 1))
    counts = (/ (b + 1, b = 0, nproc - 1) /)
    isend = (/ ((rank + 1) * j, j = 1, tri()) /)
    call MPI_Reduce_scatter(isend, irecv, counts, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
    call check(all(irecv == (/ (tri() * (rank * (rank + 1) / 2 + j), j = 1, rank + 1) /)), &
               'reduce_scatter integer sum')
  end subroutine test_reduce_scatter

  subroutine test_alltoall()
    integer :: j, d, s
    integer, allocatable :: isend(:), irecv(:)
    allocate(isend(k * nproc), irecv(k * nproc))
    isend = (/ ((rank * 100 + d * 10 + j, j = 1, k), d = 0, nproc - 1) /)
    call MPI_Alltoall(isend, k, MPI_INTEGER, irecv, k, MPI_INTEGER, MPI_COMM_WORLD, ierr)
    call check(all(irecv == (/ ((s * 100 + rank * 10 + j, j = 1, k), s = 0, nproc - 1) /)), 'alltoall integer')
    call MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, isend, k, MPI_INTEGER, MPI_COMM_WORLD, ierr)
    call check(all(isend == (/ ((s * 100 + rank * 10 + j, j = 1, k), s = 0, nproc - 1) /)), 'alltoall in place')
  end subroutine test_alltoall

  subroutine test_gather_scatter()
    integer :: j, r, root, isend(k)
    integer, allocatable :: iall(:)
    double precision :: dsend(k)
    double precision, allocatable :: dall(:)
    allocate(iall(k * nproc), dall(k * nproc))
    dsend = (/ (rank + j * 0.125d0, j = 1, k) /)
    call MPI_Gather(dsend, k, MPI_DOUBLE_PRECISION, dall, k, MPI_DOUBLE_PRECISION, 0, MPI_COMM_WORLD, ierr)
    if (rank == 0) call check(all(dall == (/ ((r + j * 0.125d0, j = 1, k), r = 0, nproc - 1) /)), 'gather real*8')
    root = nproc - 1
    if (rank == root) then
      iall = -1
      iall(rank * k + 1:rank * k + k) = (/ (rank * 3 + j, j = 1, k) /)
      call MPI_Gather(MPI_IN_PLACE, k, MPI_INTEGER, iall, k, MPI_INTEGER, root, MPI_COMM_WORLD, ierr)
      call check(all(iall == (/ ((r * 3 + j, j = 1, k), r = 0, nproc - 1) /)), 'gather integer in place')
    else
      isend = (/ (rank * 3 + j, j = 1, k) /)
      call MPI_Gather(isend, k, MPI_INTEGER, iall, k, MPI_INTEGER, root, MPI_COMM_WORLD, ierr)
    end if
    if (rank == root) iall = (/ ((r * 7 - j, j = 1, k), r = 0, nproc - 1) /)
    isend = 0
    call MPI_Scatter(iall, k, MPI_INTEGER, isend, k, MPI_INTEGER, root, MPI_COMM_WORLD, ierr)
    call check(all(isend == (/ (rank * 7 - j, j = 1, k) /)), 'scatter integer')
    if (rank == 0) then
      dall = (/ ((r + j * 2d0, j = 1, k), r = 0, nproc - 1) /)
      call MPI_Scatter(dall, k, MPI_DOUBLE_PRECISION, MPI_IN_PLACE, k, MPI_DOUBLE_PRECISION, 0, MPI_COMM_WORLD, ierr)
      call check(all(dall(1:k) == (/ (j * 2d0, j = 1, k) /)), 'scatter real*8 in place (root keeps its block)')
    else
      call MPI_Scatter(dall, k, MPI_DOUBLE_PRECISION, dsend, k, MPI_DOUBLE_PRECISION, 0, MPI_COMM_WORLD, ierr)
      call check(all(dsend == (/ (rank + j * 2d0, j = 1, k) /)), 'scatter real*8')
    end if
  end subroutine test_gather_scatter

  ! Rank r contributes r + 1 elements; alltoallv sends mod(rank + d, 3) + 1 to rank d.
  subroutine test_vector_forms()
    integer :: j, r, d, s, n, pos, root
    integer, allocatable :: counts(:), displs(:), iall(:), expect(:), mine_v(:)
    integer, allocatable :: scounts(:), sdispls(:), rcounts(:), rdispls(:)
    integer :: mine(nproc + 1)
    double precision, allocatable :: dall(:)
    double precision :: dmine(nproc + 1)
    allocate(counts(nproc), displs(nproc), iall(tri()), expect(tri()), dall(tri()))
    counts = (/ (r + 1, r = 0, nproc - 1) /)
    displs = (/ (r * (r + 1) / 2, r = 0, nproc - 1) /)
    expect = (/ ((r * 10 + j, j = 1, r + 1), r = 0, nproc - 1) /)
    mine(1:rank + 1) = (/ (rank * 10 + j, j = 1, rank + 1) /)
    call MPI_Allgatherv(mine, rank + 1, MPI_INTEGER, iall, counts, displs, MPI_INTEGER, MPI_COMM_WORLD, ierr)
    call check(all(iall == expect), 'allgatherv integer')
    iall = 0
    iall(displs(rank + 1) + 1:displs(rank + 1) + rank + 1) = mine(1:rank + 1)
    call MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, iall, counts, displs, MPI_INTEGER, MPI_COMM_WORLD, ierr)
    call check(all(iall == expect), 'allgatherv integer in place')

    root = mod(1, nproc)
    dmine(1:rank + 1) = (/ (rank + j * 0.5d0, j = 1, rank + 1) /)
    dall = -1d0
    call MPI_Gatherv(dmine, rank + 1, MPI_DOUBLE_PRECISION, dall, counts, displs, MPI_DOUBLE_PRECISION, root, &
                     MPI_COMM_WORLD, ierr)
    if (rank == root) call check(all(dall == (/ ((r + j * 0.5d0, j = 1, r + 1), r = 0, nproc - 1) /)), 'gatherv real*8')
    if (rank == 0) dall = (/ ((r * 2d0 + j, j = 1, r + 1), r = 0, nproc - 1) /)
    dmine = 0d0
    call MPI_Scatterv(dall, counts, displs, MPI_DOUBLE_PRECISION, dmine, rank + 1, MPI_DOUBLE_PRECISION, 0, &
                      MPI_COMM_WORLD, ierr)
    call check(all(dmine(1:rank + 1) == (/ (rank * 2d0 + j, j = 1, rank + 1) /)), 'scatterv real*8')

    allocate(scounts(nproc), sdispls(nproc), rcounts(nproc), rdispls(nproc))
    pos = 0
    do d = 0, nproc - 1
      scounts(d + 1) = mod(rank + d, 3) + 1
      sdispls(d + 1) = pos
      pos = pos + scounts(d + 1)
    end do
    n = pos
    deallocate(iall)
    allocate(iall(n))
    pos = 0
    do d = 0, nproc - 1
      iall(pos + 1:pos + scounts(d + 1)) = (/ (rank * 1000 + d * 10 + j, j = 1, scounts(d + 1)) /)
      pos = pos + scounts(d + 1)
    end do
    pos = 0
    do s = 0, nproc - 1
      rcounts(s + 1) = mod(s + rank, 3) + 1
      rdispls(s + 1) = pos
      pos = pos + rcounts(s + 1)
    end do
    deallocate(expect)
    allocate(expect(pos), mine_v(pos))
    do s = 0, nproc - 1
      expect(rdispls(s + 1) + 1:rdispls(s + 1) + rcounts(s + 1)) = (/ (s * 1000 + rank * 10 + j, j = 1, rcounts(s + 1)) /)
    end do
    call MPI_Alltoallv(iall, scounts, sdispls, MPI_INTEGER, mine_v, rcounts, rdispls, MPI_INTEGER, MPI_COMM_WORLD, ierr)
    call check(all(mine_v == expect), 'alltoallv integer')
  end subroutine test_vector_forms

  ! Nonblocking collectives completed by MPI_Wait, MPI_Waitall (mixed with
  ! point-to-point requests), MPI_Waitany and MPI_Waitsome.
  subroutine test_nonblocking_wait()
    integer :: j, r, s, d, idx, outcount, done, peer_from, peer_to, got
    integer :: isend(k), irecv(k), ibuf(k), reqs(4), indices(4), statuses(MPI_STATUS_SIZE, 4)
    integer :: status(MPI_STATUS_SIZE)
    integer, allocatable :: iall(:), ialltoall(:), isrc(:)
    double precision :: dsend(k), drecv(k)
    double precision, allocatable :: dall(:)
    logical :: ok
    allocate(iall(k * nproc), ialltoall(k * nproc), isrc(k * nproc), dall(k * nproc))

    isend = (/ (rank + j, j = 1, k) /)
    call MPI_Iallreduce(isend, irecv, k, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, reqs(1), ierr)
    call check(ierr == MPI_SUCCESS .and. reqs(1) /= MPI_REQUEST_NULL, 'iallreduce started')
    call MPI_Wait(reqs(1), MPI_STATUS_IGNORE, ierr)
    call check(reqs(1) == MPI_REQUEST_NULL, 'wait sets MPI_REQUEST_NULL')
    call check(all(irecv == (/ (nproc * j + nproc * (nproc - 1) / 2, j = 1, k) /)), 'iallreduce + wait')

    ! Ibcast, iallgather and a ring exchange of point-to-point messages in one waitall.
    ibuf = 0
    if (rank == 0) ibuf = (/ (j * 11, j = 1, k) /)
    peer_to = mod(rank + 1, nproc)
    peer_from = mod(rank + nproc - 1, nproc)
    call MPI_Ibcast(ibuf, k, MPI_INTEGER, 0, MPI_COMM_WORLD, reqs(1), ierr)
    call MPI_Iallgather(isend, k, MPI_INTEGER, iall, k, MPI_INTEGER, MPI_COMM_WORLD, reqs(2), ierr)
    call MPI_Irecv(got, 1, MPI_INTEGER, peer_from, 7, MPI_COMM_WORLD, reqs(3), ierr)
    call MPI_Isend(rank, 1, MPI_INTEGER, peer_to, 7, MPI_COMM_WORLD, reqs(4), ierr)
    call MPI_Waitall(4, reqs, statuses, ierr)
    call check(ierr == MPI_SUCCESS .and. all(reqs == MPI_REQUEST_NULL), 'waitall mixed requests')
    call check(all(ibuf == (/ (j * 11, j = 1, k) /)), 'ibcast in waitall')
    call check(all(iall == (/ ((r + j, j = 1, k), r = 0, nproc - 1) /)), 'iallgather in waitall')
    call check(got == peer_from .and. statuses(MPI_SOURCE, 3) == peer_from .and. statuses(MPI_TAG, 3) == 7, &
               'waitall status of the point-to-point receive')

    ! Ireduce_scatter_block and ialltoall, completed one by one with waitany.
    dall = (/ (dble(rank * b_of(j, k) + j), j = 1, k * nproc) /)
    isrc = (/ ((rank * 100 + d * 10 + j, j = 1, k), d = 0, nproc - 1) /)
    call MPI_Ireduce_scatter_block(dall, drecv, k, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, reqs(1), ierr)
    call MPI_Ialltoall(isrc, k, MPI_INTEGER, ialltoall, k, MPI_INTEGER, MPI_COMM_WORLD, reqs(2), ierr)
    ok = .true.
    do done = 1, 2
      call MPI_Waitany(2, reqs, idx, status, ierr)
      ok = ok .and. ierr == MPI_SUCCESS .and. (idx == 1 .or. idx == 2)
      if (idx == 1 .or. idx == 2) ok = ok .and. reqs(idx) == MPI_REQUEST_NULL
    end do
    call check(ok, 'waitany: 1-based index, request freed')
    call MPI_Waitany(2, reqs, idx, status, ierr)
    call check(idx == MPI_UNDEFINED, 'waitany on no active request gives MPI_UNDEFINED')
    call check(all(drecv == (/ (dble(nproc * (nproc - 1) / 2 * rank + nproc * (rank * k + j)), j = 1, k) /)), &
               'ireduce_scatter_block real*8')
    call check(all(ialltoall == (/ ((s * 100 + rank * 10 + j, j = 1, k), s = 0, nproc - 1) /)), 'ialltoall')

    ! Igather and iscatter, completed with waitsome.
    dsend = (/ (rank * 4d0 + j, j = 1, k) /)
    dall = -1d0
    if (rank == 0) isrc = (/ ((r * 9 + j, j = 1, k), r = 0, nproc - 1) /)
    ibuf = 0
    call MPI_Igather(dsend, k, MPI_DOUBLE_PRECISION, dall, k, MPI_DOUBLE_PRECISION, nproc - 1, MPI_COMM_WORLD, &
                     reqs(1), ierr)
    call MPI_Iscatter(isrc, k, MPI_INTEGER, ibuf, k, MPI_INTEGER, 0, MPI_COMM_WORLD, reqs(2), ierr)
    done = 0
    ok = .true.
    do while (done < 2 .and. ok)
      call MPI_Waitsome(2, reqs, outcount, indices, statuses, ierr)
      ok = ierr == MPI_SUCCESS .and. outcount >= 1 .and. outcount <= 2
      do j = 1, max(outcount, 0)
        ok = ok .and. (indices(j) == 1 .or. indices(j) == 2)
      end do
      done = done + max(outcount, 0)
    end do
    call check(ok .and. done == 2, 'waitsome: outcount and 1-based indices')
    call MPI_Waitsome(2, reqs, outcount, indices, MPI_STATUSES_IGNORE, ierr)
    call check(outcount == MPI_UNDEFINED, 'waitsome on no active request gives MPI_UNDEFINED')
    if (rank == nproc - 1) call check(all(dall == (/ ((r * 4d0 + j, j = 1, k), r = 0, nproc - 1) /)), 'igather')
    call check(all(ibuf == (/ (rank * 9 + j, j = 1, k) /)), 'iscatter')
  end subroutine test_nonblocking_wait

  ! Block number (0-based) of element j of a buffer of blocks of k.
  integer function b_of(j, kk)
    integer, intent(in) :: j, kk
    b_of = (j - 1) / kk
  end function b_of

  ! Nonblocking collectives completed by the MPI_Test family.
  subroutine test_nonblocking_test()
    integer :: j, idx, outcount, done, req, reqs(2), indices(2), statuses(MPI_STATUS_SIZE, 2)
    integer :: status(MPI_STATUS_SIZE), isend(k), irecv(k)
    double precision :: dbuf(k), dsum(k)
    logical :: flag, ok

    isend = (/ (rank * j, j = 1, k) /)
    call MPI_Ireduce(isend, irecv, k, MPI_INTEGER, MPI_SUM, 0, MPI_COMM_WORLD, req, ierr)
    flag = .false.
    do while (.not. flag)
      call MPI_Test(req, flag, status, ierr)
    end do
    call check(req == MPI_REQUEST_NULL, 'test sets MPI_REQUEST_NULL')
    if (rank == 0) call check(all(irecv == (/ (j * nproc * (nproc - 1) / 2, j = 1, k) /)), 'ireduce + test')

    dbuf = (/ (rank + j * 0.5d0, j = 1, k) /)
    call MPI_Iallreduce(MPI_IN_PLACE, dbuf, k, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, reqs(1), ierr)
    call MPI_Iallreduce(isend, irecv, k, MPI_INTEGER, MPI_MAX, MPI_COMM_WORLD, reqs(2), ierr)
    flag = .false.
    do while (.not. flag)
      call MPI_Testall(2, reqs, flag, statuses, ierr)
    end do
    dsum = (/ (nproc * (nproc - 1) / 2 + nproc * j * 0.5d0, j = 1, k) /)
    call check(all(dbuf == dsum), 'iallreduce real*8 in place + testall')
    call check(all(irecv == (/ ((nproc - 1) * j, j = 1, k) /)), 'iallreduce integer max + testall')

    call MPI_Iallreduce(isend, irecv, k, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, reqs(1), ierr)
    call MPI_Ibcast(dbuf, k, MPI_DOUBLE_PRECISION, 0, MPI_COMM_WORLD, reqs(2), ierr)
    done = 0
    ok = .true.
    do while (done < 2 .and. ok)
      call MPI_Testany(2, reqs, idx, flag, status, ierr)
      ok = ierr == MPI_SUCCESS
      if (flag .and. idx /= MPI_UNDEFINED) then
        ok = ok .and. (idx == 1 .or. idx == 2)
        done = done + 1
      end if
    end do
    call check(ok .and. done == 2, 'testany: 1-based index')
    call MPI_Testany(2, reqs, idx, flag, MPI_STATUS_IGNORE, ierr)
    call check(flag .and. idx == MPI_UNDEFINED, 'testany on no active request')
    call check(all(irecv == (/ (j * nproc * (nproc - 1) / 2, j = 1, k) /)), 'iallreduce + testany')
    call check(all(dbuf == dsum), 'ibcast + testany')

    call MPI_Ibcast(irecv, k, MPI_INTEGER, nproc - 1, MPI_COMM_WORLD, reqs(1), ierr)
    call MPI_Iallreduce(isend, isend, 0, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, reqs(2), ierr)
    done = 0
    ok = .true.
    do while (done < 2 .and. ok)
      call MPI_Testsome(2, reqs, outcount, indices, statuses, ierr)
      ok = ierr == MPI_SUCCESS .and. outcount >= 0 .and. outcount <= 2
      do j = 1, max(outcount, 0)
        ok = ok .and. (indices(j) == 1 .or. indices(j) == 2)
      end do
      done = done + max(outcount, 0)
    end do
    call check(ok .and. done == 2, 'testsome: 1-based indices')
    call check(all(reqs == MPI_REQUEST_NULL), 'testsome completes every request')
    call check(all(irecv == (/ (j * nproc * (nproc - 1) / 2, j = 1, k) /)), 'ibcast + testsome')
  end subroutine test_nonblocking_test

  subroutine test_request_free_cancel()
    integer :: req, rreq, got, never, status(MPI_STATUS_SIZE)
    logical :: cancelled
    ! A send to self whose request is freed; the receive still gets the data.
    call MPI_Irecv(got, 1, MPI_INTEGER, rank, 11, MPI_COMM_WORLD, rreq, ierr)
    call MPI_Isend(rank + 40, 1, MPI_INTEGER, rank, 11, MPI_COMM_WORLD, req, ierr)
    call MPI_Request_free(req, ierr)
    call check(ierr == MPI_SUCCESS .and. req == MPI_REQUEST_NULL, 'request_free sets MPI_REQUEST_NULL')
    call MPI_Wait(rreq, status, ierr)
    call check(got == rank + 40 .and. status(MPI_SOURCE) == rank .and. status(MPI_TAG) == 11, &
               'wait status after request_free of the send')
    ! A receive nobody matches, cancelled.
    call MPI_Irecv(never, 1, MPI_INTEGER, rank, 12, MPI_COMM_WORLD, rreq, ierr)
    call MPI_Cancel(rreq, ierr)
    call check(ierr == MPI_SUCCESS .and. rreq /= MPI_REQUEST_NULL, 'cancel keeps the request')
    call MPI_Wait(rreq, status, ierr)
    call MPI_Test_cancelled(status, cancelled, ierr)
    call check(cancelled, 'cancelled receive reports cancelled')
  end subroutine test_request_free_cancel

end program collectives
