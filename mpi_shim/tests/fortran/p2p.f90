! Every point-to-point call the gpucoll MPI shim intercepts, through mpif.h (Open
! MPI's mpi_xxx_ entry points): blocking, nonblocking and persistent sends and
! receives, Sendrecv(_replace), matched receives, Start/Startall restarted, statuses
! (MPI_Get_count) and MPI_STATUS_IGNORE, with exact expected values computed from
! (sender, round, index). Build: mpif90 -fallow-argument-mismatch. Run with any
! number of ranks; rank 0 prints "N passed, M failed" and the program stops with a
! nonzero code on any failure.
program p2p
  implicit none
  include 'mpif.h'
  integer, parameter :: n = 37
  integer :: rank, nproc, ierr, npass, nfail, totals(2), next, prev
  integer :: attach(4096), asize

  npass = 0
  nfail = 0
  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nproc, ierr)
  next = mod(rank + 1, nproc)
  prev = mod(rank + nproc - 1, nproc)
  call MPI_Buffer_attach(attach, 4 * 4096, ierr)

  call test_blocking()
  call test_nonblocking()
  call test_sendrecv()
  call test_matched()
  call test_persistent()

  call MPI_Buffer_detach(attach, asize, ierr)
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

  ! What rank `src` sends in round `round`.
  subroutine values(src, round, v)
    integer, intent(in) :: src, round
    integer, intent(out) :: v(n)
    integer :: j
    do j = 1, n
      v(j) = src * 100000 + round * 1000 + j
    end do
  end subroutine values

  logical function holds(got, src, round, upto)
    integer, intent(in) :: got(:), src, round, upto
    integer :: want(n)
    call values(src, round, want)
    holds = all(got(1:upto) == want(1:upto))
    if (size(got) > upto) holds = holds .and. all(got(upto + 1:) == -7)
  end function holds

  logical function counted(status, cnt)
    integer, intent(in) :: status(MPI_STATUS_SIZE), cnt
    integer :: got
    call MPI_Get_count(status, MPI_INTEGER, got, ierr)
    counted = got == cnt
  end function counted

  subroutine test_blocking()
    integer :: sbuf(n), rbuf(n + 3), status(MPI_STATUS_SIZE), form, peer, req
    peer = ieor(rank, 1)
    if (peer >= nproc) return
    do form = 0, 3
      if (mod(rank, 2) == 0) then
        call values(rank, form, sbuf)
        select case (form)
        case (0)
          call MPI_Send(sbuf, n, MPI_INTEGER, peer, form, MPI_COMM_WORLD, ierr)
        case (1)
          call MPI_Ssend(sbuf, n, MPI_INTEGER, peer, form, MPI_COMM_WORLD, ierr)
        case (2)
          call MPI_Bsend(sbuf, n, MPI_INTEGER, peer, form, MPI_COMM_WORLD, ierr)
        case default
          ! a ready send: the receiver says its receive is posted
          call MPI_Recv(rbuf, 0, MPI_INTEGER, peer, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE, ierr)
          call MPI_Rsend(sbuf, n, MPI_INTEGER, peer, form, MPI_COMM_WORLD, ierr)
        end select
        call check(ierr == MPI_SUCCESS, 'blocking send ierror')
      else
        rbuf = -7
        if (form == 3) then
          call MPI_Irecv(rbuf, n + 3, MPI_INTEGER, peer, form, MPI_COMM_WORLD, req, ierr)
          call MPI_Send(sbuf, 0, MPI_INTEGER, peer, 99, MPI_COMM_WORLD, ierr)
          call MPI_Wait(req, status, ierr)
        else
          call MPI_Recv(rbuf, n + 3, MPI_INTEGER, peer, form, MPI_COMM_WORLD, status, ierr)
        end if
        call check(ierr == MPI_SUCCESS .and. holds(rbuf, peer, form, n), 'blocking receive data')
        call check(counted(status, n) .and. status(MPI_SOURCE) == peer .and. status(MPI_TAG) == form, &
                   'blocking receive status')
      end if
    end do
  end subroutine test_blocking

  subroutine test_nonblocking()
    integer :: sbuf(n), rbuf(n), reqs(2), statuses(MPI_STATUS_SIZE, 2), form
    do form = 0, 3
      call values(rank, 10 + form, sbuf)
      rbuf = -7
      call MPI_Irecv(rbuf, n, MPI_INTEGER, prev, 20 + form, MPI_COMM_WORLD, reqs(1), ierr)
      if (form == 3) call MPI_Barrier(MPI_COMM_WORLD, ierr)
      select case (form)
      case (0)
        call MPI_Isend(sbuf, n, MPI_INTEGER, next, 20 + form, MPI_COMM_WORLD, reqs(2), ierr)
      case (1)
        call MPI_Issend(sbuf, n, MPI_INTEGER, next, 20 + form, MPI_COMM_WORLD, reqs(2), ierr)
      case (2)
        call MPI_Ibsend(sbuf, n, MPI_INTEGER, next, 20 + form, MPI_COMM_WORLD, reqs(2), ierr)
      case default
        call MPI_Irsend(sbuf, n, MPI_INTEGER, next, 20 + form, MPI_COMM_WORLD, reqs(2), ierr)
      end select
      call check(ierr == MPI_SUCCESS, 'nonblocking send ierror')
      call MPI_Waitall(2, reqs, statuses, ierr)
      call check(ierr == MPI_SUCCESS .and. holds(rbuf, prev, 10 + form, n), 'nonblocking data')
      call check(counted(statuses(:, 1), n) .and. statuses(MPI_SOURCE, 1) == prev, &
                 'nonblocking status')
      call check(all(reqs == MPI_REQUEST_NULL), 'nonblocking requests freed')
    end do
  end subroutine test_nonblocking

  subroutine test_sendrecv()
    integer :: sbuf(n), rbuf(n + 2), status(MPI_STATUS_SIZE)
    call values(rank, 30, sbuf)
    rbuf = -7
    call MPI_Sendrecv(sbuf, n, MPI_INTEGER, next, 31, rbuf, n + 2, MPI_INTEGER, prev, 31, &
                      MPI_COMM_WORLD, status, ierr)
    call check(ierr == MPI_SUCCESS .and. holds(rbuf, prev, 30, n) .and. counted(status, n), &
               'sendrecv')
    call values(rank, 32, sbuf)
    call MPI_Sendrecv_replace(sbuf, n, MPI_INTEGER, next, 33, prev, 33, MPI_COMM_WORLD, &
                              MPI_STATUS_IGNORE, ierr)
    call check(ierr == MPI_SUCCESS .and. holds(sbuf, prev, 32, n), 'sendrecv_replace')
  end subroutine test_sendrecv

  subroutine test_matched()
    integer :: sbuf(n), rbuf(n), status(MPI_STATUS_SIZE), msg, req, sreq
    logical :: found
    call values(rank, 40, sbuf)
    rbuf = -7
    call MPI_Isend(sbuf, n, MPI_INTEGER, rank, 41, MPI_COMM_WORLD, sreq, ierr)
    call MPI_Mprobe(rank, 41, MPI_COMM_WORLD, msg, status, ierr)
    call MPI_Mrecv(rbuf, n, MPI_INTEGER, msg, status, ierr)
    call check(ierr == MPI_SUCCESS .and. msg == MPI_MESSAGE_NULL, 'mrecv sets MPI_MESSAGE_NULL')
    call check(holds(rbuf, rank, 40, n) .and. counted(status, n), 'mrecv data and status')
    call MPI_Wait(sreq, MPI_STATUS_IGNORE, ierr)
    rbuf = -7
    call MPI_Isend(sbuf, n - 5, MPI_INTEGER, rank, 42, MPI_COMM_WORLD, sreq, ierr)
    found = .false.
    do while (.not. found)
      call MPI_Improbe(rank, 42, MPI_COMM_WORLD, found, msg, status, ierr)
    end do
    call MPI_Imrecv(rbuf, n, MPI_INTEGER, msg, req, ierr)
    call check(ierr == MPI_SUCCESS .and. msg == MPI_MESSAGE_NULL, 'imrecv sets MPI_MESSAGE_NULL')
    call MPI_Wait(req, status, ierr)
    call MPI_Wait(sreq, MPI_STATUS_IGNORE, ierr)
    call check(holds(rbuf, rank, 40, n - 5) .and. counted(status, n - 5), 'imrecv data and status')
  end subroutine test_matched

  subroutine test_persistent()
    integer :: sbuf(n), rbuf(n), reqs(2), status(MPI_STATUS_SIZE), form, round, keep(2)
    do form = 0, 3
      call MPI_Recv_init(rbuf, n, MPI_INTEGER, prev, 50 + form, MPI_COMM_WORLD, reqs(1), ierr)
      select case (form)
      case (0)
        call MPI_Send_init(sbuf, n, MPI_INTEGER, next, 50 + form, MPI_COMM_WORLD, reqs(2), ierr)
      case (1)
        call MPI_Ssend_init(sbuf, n, MPI_INTEGER, next, 50 + form, MPI_COMM_WORLD, reqs(2), ierr)
      case (2)
        call MPI_Bsend_init(sbuf, n, MPI_INTEGER, next, 50 + form, MPI_COMM_WORLD, reqs(2), ierr)
      case default
        call MPI_Rsend_init(sbuf, n, MPI_INTEGER, next, 50 + form, MPI_COMM_WORLD, reqs(2), ierr)
      end select
      call check(ierr == MPI_SUCCESS, 'persistent init ierror')
      keep = reqs
      ! Open MPI 4.1 sends zeros when a persistent Bsend is restarted: once.
      do round = 1, merge(1, 3, form == 2)
        call values(rank, 60 + round, sbuf)
        rbuf = -7
        if (form == 3) then
          call MPI_Start(reqs(1), ierr)
          call MPI_Barrier(MPI_COMM_WORLD, ierr)
          call MPI_Start(reqs(2), ierr)
        else if (round == 2) then
          call MPI_Start(reqs(2), ierr)
          call MPI_Start(reqs(1), ierr)
        else
          call MPI_Startall(2, reqs, ierr)
        end if
        call check(ierr == MPI_SUCCESS, 'start ierror')
        call MPI_Wait(reqs(1), status, ierr)
        call MPI_Wait(reqs(2), MPI_STATUS_IGNORE, ierr)
        call check(holds(rbuf, prev, 60 + round, n) .and. counted(status, n), 'persistent data')
        call check(all(reqs == keep), 'persistent requests stay after completion')
      end do
      call MPI_Request_free(reqs(1), ierr)
      call MPI_Request_free(reqs(2), ierr)
      call check(ierr == MPI_SUCCESS .and. all(reqs == MPI_REQUEST_NULL), 'request_free')
    end do
  end subroutine test_persistent

end program p2p
