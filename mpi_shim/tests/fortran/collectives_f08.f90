! The collectives of the gpucoll MPI shim through `use mpi_f08` (Open MPI's
! mpi_xxx_f08_ entry points): typed handles, optional ierror (omitted in some calls),
! MPI_IN_PLACE, MPI_STATUS(ES)_IGNORE, nonblocking forms with the completion calls.
! Run with any number of ranks; rank 0 prints "N passed, M failed" (N depends only on
! the rank count) and the program stops with a nonzero code on any failure.
program collectives_f08
  use mpi_f08
  implicit none
  integer, parameter :: k = 5
  integer :: rank, nproc, ierr, npass, nfail, totals(2)

  npass = 0
  nfail = 0
  call MPI_Init(ierr)
  call check(ierr == MPI_SUCCESS, 'MPI_Init ierror')
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, nproc)

  call test_blocking()
  call test_vector_forms()
  call test_nonblocking()

  call MPI_Barrier(MPI_COMM_WORLD)
  totals = [npass, nfail]
  call MPI_Allreduce(MPI_IN_PLACE, totals, 2, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  if (rank == 0) print '(I0," passed, ",I0," failed")', totals(1), totals(2)
  call MPI_Finalize()
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

  subroutine test_blocking()
    integer :: j, r, isend(k), irecv(k)
    integer, allocatable :: iall(:), ialltoall(:)
    double precision :: dbuf(k)
    allocate(iall(k * nproc), ialltoall(k * nproc))
    isend = [(rank + j, j = 1, k)]
    call MPI_Allreduce(isend, irecv, k, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
    call check(ierr == MPI_SUCCESS .and. all(irecv == [(nproc * j + nproc * (nproc - 1) / 2, j = 1, k)]), &
               'allreduce integer sum')
    dbuf = [((rank + 1) * j * 0.5d0, j = 1, k)]
    call MPI_Allreduce(MPI_IN_PLACE, dbuf, k, MPI_DOUBLE_PRECISION, MPI_MAX, MPI_COMM_WORLD)
    call check(all(dbuf == [(nproc * j * 0.5d0, j = 1, k)]), 'allreduce real*8 max in place, no ierror')
    if (rank == 0) then
      call MPI_Reduce(MPI_IN_PLACE, isend, k, MPI_INTEGER, MPI_SUM, 0, MPI_COMM_WORLD, ierr)
      call check(all(isend == [(nproc * j + nproc * (nproc - 1) / 2, j = 1, k)]), 'reduce integer in place')
    else
      call MPI_Reduce(isend, irecv, k, MPI_INTEGER, MPI_SUM, 0, MPI_COMM_WORLD, ierr)
    end if
    dbuf = 0d0
    if (rank == nproc - 1) dbuf = [(j * 1.5d0, j = 1, k)]
    call MPI_Bcast(dbuf, k, MPI_DOUBLE_PRECISION, nproc - 1, MPI_COMM_WORLD)
    call check(all(dbuf == [(j * 1.5d0, j = 1, k)]), 'bcast real*8')
    isend = [(rank * 10 + j, j = 1, k)]
    call MPI_Gather(isend, k, MPI_INTEGER, iall, k, MPI_INTEGER, 0, MPI_COMM_WORLD, ierr)
    if (rank == 0) call check(all(iall == [((r * 10 + j, j = 1, k), r = 0, nproc - 1)]), 'gather integer')
    iall = [((rank * 100 + r * 10 + j, j = 1, k), r = 0, nproc - 1)]
    call MPI_Alltoall(iall, k, MPI_INTEGER, ialltoall, k, MPI_INTEGER, MPI_COMM_WORLD, ierr)
    call check(all(ialltoall == [((r * 100 + rank * 10 + j, j = 1, k), r = 0, nproc - 1)]), 'alltoall integer')
  end subroutine test_blocking

  ! Rank r owns r + 1 elements.
  subroutine test_vector_forms()
    integer :: j, r, n
    integer, allocatable :: counts(:), displs(:)
    double precision, allocatable :: dall(:)
    double precision :: dmine(nproc)
    n = nproc * (nproc + 1) / 2
    allocate(counts(nproc), displs(nproc), dall(n))
    counts = [(r + 1, r = 0, nproc - 1)]
    displs = [(r * (r + 1) / 2, r = 0, nproc - 1)]
    dall = 0d0
    dall(displs(rank + 1) + 1:displs(rank + 1) + rank + 1) = [(rank + j * 0.25d0, j = 1, rank + 1)]
    call MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, dall, counts, displs, MPI_DOUBLE_PRECISION, &
                        MPI_COMM_WORLD, ierr)
    call check(all(dall == [((r + j * 0.25d0, j = 1, r + 1), r = 0, nproc - 1)]), 'allgatherv real*8 in place')
    if (rank == 0) dall = [((r * 3d0 + j, j = 1, r + 1), r = 0, nproc - 1)]
    dmine = 0d0
    call MPI_Scatterv(dall, counts, displs, MPI_DOUBLE_PRECISION, dmine, rank + 1, MPI_DOUBLE_PRECISION, 0, &
                      MPI_COMM_WORLD, ierr)
    call check(all(dmine(1:rank + 1) == [(rank * 3d0 + j, j = 1, rank + 1)]), 'scatterv real*8')
  end subroutine test_vector_forms

  subroutine test_nonblocking()
    type(MPI_Request) :: req, reqs(3)
    type(MPI_Status) :: status, statuses(3)
    integer :: j, r, idx, done, isend(k), irecv(k), got
    integer, allocatable :: iall(:)
    double precision :: dbuf(k)
    logical :: flag, ok
    allocate(iall(k * nproc))

    isend = [(rank * j, j = 1, k)]
    call MPI_Iallreduce(isend, irecv, k, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, req, ierr)
    call MPI_Wait(req, MPI_STATUS_IGNORE, ierr)
    call check(ierr == MPI_SUCCESS .and. req == MPI_REQUEST_NULL, 'wait on iallreduce')
    call check(all(irecv == [(j * nproc * (nproc - 1) / 2, j = 1, k)]), 'iallreduce integer sum')

    dbuf = 0d0
    if (rank == 0) dbuf = [(j * 2d0, j = 1, k)]
    call MPI_Ibcast(dbuf, k, MPI_DOUBLE_PRECISION, 0, MPI_COMM_WORLD, reqs(1))
    call MPI_Iallgather(isend, k, MPI_INTEGER, iall, k, MPI_INTEGER, MPI_COMM_WORLD, reqs(2))
    call MPI_Irecv(got, 1, MPI_INTEGER, rank, 3, MPI_COMM_WORLD, reqs(3))
    call MPI_Send(rank + 70, 1, MPI_INTEGER, rank, 3, MPI_COMM_WORLD)
    call MPI_Waitall(3, reqs, statuses, ierr)
    call check(ierr == MPI_SUCCESS .and. all(reqs == MPI_REQUEST_NULL), 'waitall mixed requests')
    call check(all(dbuf == [(j * 2d0, j = 1, k)]), 'ibcast real*8')
    call check(all(iall == [((r * j, j = 1, k), r = 0, nproc - 1)]), 'iallgather integer')
    call check(got == rank + 70 .and. statuses(3)%MPI_SOURCE == rank .and. statuses(3)%MPI_TAG == 3, &
               'waitall status of the point-to-point receive')

    call MPI_Ireduce_scatter_block(iall, irecv, k, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, reqs(1), ierr)
    call MPI_Igather(isend, k, MPI_INTEGER, iall, k, MPI_INTEGER, nproc - 1, MPI_COMM_WORLD, reqs(2), ierr)
    done = 0
    ok = .true.
    do while (done < 2 .and. ok)
      call MPI_Testany(2, reqs(1:2), idx, flag, status, ierr)
      ok = ierr == MPI_SUCCESS
      if (flag .and. idx /= MPI_UNDEFINED) then
        ok = ok .and. (idx == 1 .or. idx == 2)
        done = done + 1
      end if
    end do
    call check(ok .and. done == 2, 'testany: 1-based index')
    call check(all(irecv == [(nproc * rank * j, j = 1, k)]), 'ireduce_scatter_block integer')
    if (rank == nproc - 1) call check(all(iall == [((r * j, j = 1, k), r = 0, nproc - 1)]), 'igather integer')
  end subroutine test_nonblocking

end program collectives_f08
