! Point-to-point through `use mpi_f08` (Open MPI's mpi_xxx_f08_ entry points, which
! the gpucoll MPI shim exports): typed handles, optional ierror, blocking,
! nonblocking and persistent forms restarted, a matched receive, statuses. Run with
! any number of ranks; rank 0 prints "N passed, M failed" and the program stops with
! a nonzero code on any failure.
program p2p_f08
  use mpi_f08
  implicit none
  integer, parameter :: n = 29
  integer :: rank, nproc, ierr, npass, nfail, totals(2), next, prev

  npass = 0
  nfail = 0
  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, nproc)
  next = mod(rank + 1, nproc)
  prev = mod(rank + nproc - 1, nproc)

  call test_ring()
  call test_persistent()
  call test_matched()

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

  function values(src, round) result(v)
    integer, intent(in) :: src, round
    double precision :: v(n)
    integer :: j
    v = [((src * 1000 + round * 100 + j) * 0.25d0, j = 1, n)]
  end function values

  subroutine test_ring()
    double precision :: sbuf(n), rbuf(n)
    type(MPI_Request) :: reqs(2)
    type(MPI_Status) :: statuses(2), status
    integer :: cnt
    sbuf = values(rank, 1)
    rbuf = -1
    call MPI_Irecv(rbuf, n, MPI_DOUBLE_PRECISION, prev, 1, MPI_COMM_WORLD, reqs(1))
    call MPI_Isend(sbuf, n, MPI_DOUBLE_PRECISION, next, 1, MPI_COMM_WORLD, reqs(2), ierr)
    call MPI_Waitall(2, reqs, statuses)
    call MPI_Get_count(statuses(1), MPI_DOUBLE_PRECISION, cnt)
    call check(all(rbuf == values(prev, 1)) .and. cnt == n .and. statuses(1)%MPI_SOURCE == prev, &
               'isend/irecv')
    sbuf = values(rank, 2)
    rbuf = -1
    if (mod(rank, 2) == 0) then
      call MPI_Send(sbuf, n, MPI_DOUBLE_PRECISION, next, 2, MPI_COMM_WORLD)
      call MPI_Recv(rbuf, n, MPI_DOUBLE_PRECISION, prev, 2, MPI_COMM_WORLD, status)
    else
      call MPI_Recv(rbuf, n, MPI_DOUBLE_PRECISION, prev, 2, MPI_COMM_WORLD, status)
      call MPI_Send(sbuf, n, MPI_DOUBLE_PRECISION, next, 2, MPI_COMM_WORLD)
    end if
    call MPI_Get_count(status, MPI_DOUBLE_PRECISION, cnt)
    call check(all(rbuf == values(prev, 2)) .and. cnt == n .and. status%MPI_TAG == 2, 'send/recv')
    sbuf = values(rank, 3)
    rbuf = -1
    call MPI_Sendrecv(sbuf, n, MPI_DOUBLE_PRECISION, next, 3, rbuf, n, MPI_DOUBLE_PRECISION, &
                      prev, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE)
    call check(all(rbuf == values(prev, 3)), 'sendrecv')
  end subroutine test_ring

  subroutine test_persistent()
    double precision :: sbuf(n), rbuf(n)
    type(MPI_Request) :: reqs(2)
    type(MPI_Status) :: statuses(2)
    integer :: round, cnt
    call MPI_Recv_init(rbuf, n, MPI_DOUBLE_PRECISION, prev, 4, MPI_COMM_WORLD, reqs(1))
    call MPI_Send_init(sbuf, n, MPI_DOUBLE_PRECISION, next, 4, MPI_COMM_WORLD, reqs(2), ierr)
    do round = 1, 3
      sbuf = values(rank, 10 + round)
      rbuf = -1
      if (round == 2) then
        call MPI_Start(reqs(1))
        call MPI_Start(reqs(2), ierr)
      else
        call MPI_Startall(2, reqs)
      end if
      call MPI_Waitall(2, reqs, statuses)
      call MPI_Get_count(statuses(1), MPI_DOUBLE_PRECISION, cnt)
      call check(all(rbuf == values(prev, 10 + round)) .and. cnt == n, 'persistent round')
    end do
    call MPI_Request_free(reqs(1))
    call MPI_Request_free(reqs(2))
    call check(reqs(1) == MPI_REQUEST_NULL .and. reqs(2) == MPI_REQUEST_NULL, 'request_free')
  end subroutine test_persistent

  subroutine test_matched()
    double precision :: sbuf(n), rbuf(n)
    type(MPI_Request) :: sreq
    type(MPI_Message) :: msg
    type(MPI_Status) :: status
    integer :: cnt
    sbuf = values(rank, 20)
    rbuf = -1
    call MPI_Isend(sbuf, n, MPI_DOUBLE_PRECISION, rank, 5, MPI_COMM_WORLD, sreq)
    call MPI_Mprobe(rank, 5, MPI_COMM_WORLD, msg, status)
    call MPI_Mrecv(rbuf, n, MPI_DOUBLE_PRECISION, msg, status)
    call MPI_Wait(sreq, MPI_STATUS_IGNORE)
    call MPI_Get_count(status, MPI_DOUBLE_PRECISION, cnt)
    call check(all(rbuf == values(rank, 20)) .and. cnt == n .and. msg == MPI_MESSAGE_NULL, 'mrecv')
  end subroutine test_matched

end program p2p_f08
