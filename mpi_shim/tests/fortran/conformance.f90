! The Fortran entry points added for MPI conformance (issue 31), through
! mpif.h, with exact expected values: MPI_Scan, MPI_Exscan, MPI_Iscan,
! MPI_Iexscan, MPI_Ireduce_scatter (equal counts), MPI_Reduce_local,
! MPI_Alltoallw, MPI_Ialltoallw, MPI_Iallgatherv, MPI_Ialltoallv,
! MPI_Igatherv, MPI_Iscatterv, MPI_Ibarrier, the neighbourhood collectives on
! a periodic ring, MPI_Pack/MPI_Unpack and their external forms, one-sided
! transfers into an MPI_Win_allocate window and MPI-IO at explicit offsets.
! One-sided and MPI-IO calls on the program's buffers must work, except
! under a shim in its host test mode (GPUCOLL_SHIM_HOST=1 with
! GPUCOLL_SHIM_HOST_REFUSE=1), where host
! buffers count as device memory and must be refused with MPI_ERR_BUFFER.
! Build: mpif90 -fallow-argument-mismatch. Rank 0 prints "N passed, M failed".
program conformance
  implicit none
  include 'mpif.h'
  integer, parameter :: k = 5
  integer :: rank, nproc, ierr, npass, nfail, totals(2)
  logical :: refused

  npass = 0
  nfail = 0
  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nproc, ierr)
  call MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN, ierr)
  refused = host_test_mode()

  call test_scans()
  call test_reduce_scatter_local()
  call test_alltoallw()
  call test_vector_nonblocking()
  call test_neighbors()
  call test_pack()
  call test_one_sided()
  call test_file_io()

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

  ! A shim's host test mode with its refusals on, where host buffers stand
  ! for device memory in one-sided and MPI-IO calls.
  logical function host_test_mode()
    character(len=8) :: host, shim, refuse
    integer :: lh, ls, lr
    call get_environment_variable('GPUCOLL_SHIM_HOST', host, lh)
    call get_environment_variable('GPUCOLL_SHIM', shim, ls)
    call get_environment_variable('GPUCOLL_SHIM_HOST_REFUSE', refuse, lr)
    host_test_mode = lh > 0 .and. host(1:1) == '1' .and. .not. (ls > 0 .and. shim(1:1) == '0') &
         .and. lr > 0 .and. refuse(1:1) == '1'
  end function host_test_mode

  ! One-sided and MPI-IO: success, or MPI_ERR_BUFFER where refused.
  logical function as_expected(code)
    integer, intent(in) :: code
    integer :: cls, e
    cls = MPI_SUCCESS
    if (code /= MPI_SUCCESS) call MPI_Error_class(code, cls, e)
    if (refused) then
      as_expected = cls == MPI_ERR_BUFFER
    else
      as_expected = cls == MPI_SUCCESS
    end if
  end function as_expected

  subroutine test_scans()
    integer :: mine(k), got(k), i, req
    do i = 1, k
      mine(i) = (rank + 1) * i
    end do
    call MPI_Scan(mine, got, k, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
    call check(ierr == 0 .and. all(got == (/ (i * (rank + 1) * (rank + 2) / 2, i = 1, k) /)), 'Scan')
    got = -7
    call MPI_Exscan(mine, got, k, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
    if (rank > 0) then
      call check(ierr == 0 .and. all(got == (/ (i * rank * (rank + 1) / 2, i = 1, k) /)), 'Exscan')
    end if
    got = mine
    call MPI_Iscan(MPI_IN_PLACE, got, k, MPI_INTEGER, MPI_MAX, MPI_COMM_WORLD, req, ierr)
    call MPI_Wait(req, MPI_STATUS_IGNORE, ierr)
    call check(ierr == 0 .and. all(got == mine), 'Iscan in place (max)')
    call MPI_Iexscan(mine, got, k, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, req, ierr)
    call MPI_Wait(req, MPI_STATUS_IGNORE, ierr)
    if (rank > 0) then
      call check(ierr == 0 .and. all(got == (/ (i * rank * (rank + 1) / 2, i = 1, k) /)), 'Iexscan')
    end if
  end subroutine test_scans

  subroutine test_reduce_scatter_local()
    integer :: send(k * nproc), got(k), counts(nproc), i, req
    double precision :: a(k), b(k)
    counts = k
    do i = 1, k * nproc
      send(i) = i + rank
    end do
    call MPI_Ireduce_scatter(send, got, counts, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, req, ierr)
    call MPI_Wait(req, MPI_STATUS_IGNORE, ierr)
    call check(ierr == 0 .and. all(got == (/ (nproc * (rank * k + i) + nproc * (nproc - 1) / 2, &
                                              i = 1, k) /)), 'Ireduce_scatter')
    a = (/ (dble(i), i = 1, k) /)
    b = 0.5d0
    call MPI_Reduce_local(a, b, k, MPI_DOUBLE_PRECISION, MPI_SUM, ierr)
    call check(ierr == 0 .and. all(b == a + 0.5d0), 'Reduce_local')
  end subroutine test_reduce_scatter_local

  ! Rank r sends r + 10 * d (one integer) to rank d, at byte displacement
  ! 4 * d; the receiver places what comes from s at 4 * s.
  subroutine test_alltoallw()
    integer :: send(nproc), got(nproc), counts(nproc), displs(nproc), types(nproc), i, req
    do i = 1, nproc
      send(i) = rank + 10 * (i - 1)
      counts(i) = 1
      displs(i) = 4 * (i - 1)
      types(i) = MPI_INTEGER
    end do
    got = -1
    call MPI_Alltoallw(send, counts, displs, types, got, counts, displs, types, MPI_COMM_WORLD, ierr)
    call check(ierr == 0 .and. all(got == (/ (i - 1 + 10 * rank, i = 1, nproc) /)), 'Alltoallw')
    got = -1
    call MPI_Ialltoallw(send, counts, displs, types, got, counts, displs, types, MPI_COMM_WORLD, &
                        req, ierr)
    call MPI_Wait(req, MPI_STATUS_IGNORE, ierr)
    call check(ierr == 0 .and. all(got == (/ (i - 1 + 10 * rank, i = 1, nproc) /)), 'Ialltoallw')
  end subroutine test_alltoallw

  subroutine test_vector_nonblocking()
    integer :: counts(nproc), displs(nproc), buf(nproc * (nproc + 1) / 2 + nproc), mine(nproc)
    integer :: reqs(5), i, j, at
    at = 0
    do i = 1, nproc
      counts(i) = i
      displs(i) = at
      at = at + i
    end do
    mine = rank
    buf = -1
    call MPI_Iallgatherv(mine, rank + 1, MPI_INTEGER, buf, counts, displs, MPI_INTEGER, &
                         MPI_COMM_WORLD, reqs(1), ierr)
    call MPI_Ibarrier(MPI_COMM_WORLD, reqs(2), ierr)
    call MPI_Waitall(2, reqs, MPI_STATUSES_IGNORE, ierr)
    at = 0
    do i = 1, nproc
      do j = 1, i
        at = at + 1
        if (buf(at) /= i - 1) ierr = -1
      end do
    end do
    call check(ierr == 0, 'Iallgatherv + Ibarrier')
    ! Igatherv to rank 0, then Iscatterv back
    buf = -1
    call MPI_Igatherv(mine, rank + 1, MPI_INTEGER, buf, counts, displs, MPI_INTEGER, 0, &
                      MPI_COMM_WORLD, reqs(1), ierr)
    call MPI_Wait(reqs(1), MPI_STATUS_IGNORE, ierr)
    if (rank == 0) then
      at = 0
      do i = 1, nproc
        do j = 1, i
          at = at + 1
          if (buf(at) /= i - 1) ierr = -1
        end do
      end do
      call check(ierr == 0, 'Igatherv')
    end if
    mine = -1
    call MPI_Iscatterv(buf, counts, displs, MPI_INTEGER, mine, rank + 1, MPI_INTEGER, 0, &
                       MPI_COMM_WORLD, reqs(1), ierr)
    call MPI_Wait(reqs(1), MPI_STATUS_IGNORE, ierr)
    call check(ierr == 0 .and. all(mine(1:rank + 1) == rank), 'Iscatterv')
    ! Ialltoallv: one integer to each rank
    counts = 1
    displs = (/ (i - 1, i = 1, nproc) /)
    mine = (/ (100 * rank + i - 1, i = 1, nproc) /)
    buf(1:nproc) = -1
    call MPI_Ialltoallv(mine, counts, displs, MPI_INTEGER, buf, counts, displs, MPI_INTEGER, &
                        MPI_COMM_WORLD, reqs(1), ierr)
    call MPI_Wait(reqs(1), MPI_STATUS_IGNORE, ierr)
    call check(ierr == 0 .and. all(buf(1:nproc) == (/ (100 * (i - 1) + rank, i = 1, nproc) /)), &
               'Ialltoallv')
  end subroutine test_vector_nonblocking

  ! A periodic ring: neighbours left (slot 1) and right (slot 2).
  subroutine test_neighbors()
    integer :: ring, left, right, got(2), send(2), counts(2), displs(2), types(2), req
    integer(kind=MPI_ADDRESS_KIND) :: adispls(2)
    call MPI_Cart_create(MPI_COMM_WORLD, 1, (/ nproc /), (/ .true. /), .false., ring, ierr)
    call MPI_Cart_shift(ring, 0, 1, left, right, ierr)
    got = -1
    call MPI_Neighbor_allgather(rank, 1, MPI_INTEGER, got, 1, MPI_INTEGER, ring, ierr)
    call check(ierr == 0 .and. got(1) == left .and. got(2) == right, 'Neighbor_allgather')
    ! slot 1 goes left and arrives in the left rank's slot 2
    send = (/ 10 * rank + 1, 10 * rank + 2 /)
    got = -1
    call MPI_Ineighbor_alltoall(send, 1, MPI_INTEGER, got, 1, MPI_INTEGER, ring, req, ierr)
    call MPI_Wait(req, MPI_STATUS_IGNORE, ierr)
    if (nproc > 2) call check(ierr == 0 .and. got(1) == 10 * left + 2 .and. &
                              got(2) == 10 * right + 1, 'Ineighbor_alltoall')
    counts = 1
    adispls = (/ 0_MPI_ADDRESS_KIND, 4_MPI_ADDRESS_KIND /)
    types = MPI_INTEGER
    got = -1
    call MPI_Neighbor_alltoallw(send, counts, adispls, types, got, counts, adispls, types, ring, ierr)
    ! Open MPI 4.1's own mpif.h wrapper converts as many datatypes as the
    ! communicator has ranks, not neighbours: wrong on one rank (2 neighbours)
    if (nproc > 1) call check(ierr == 0 .and. got(1) == 10 * left + 2 .and. &
                              got(2) == 10 * right + 1, 'Neighbor_alltoallw')
    displs = (/ 0, 1 /)
    got = -1
    call MPI_Neighbor_alltoallv(send, counts, displs, MPI_INTEGER, got, counts, displs, &
                                MPI_INTEGER, ring, ierr)
    call check(ierr == 0 .and. got(1) == 10 * left + 2 .and. got(2) == 10 * right + 1, &
               'Neighbor_alltoallv')
    call MPI_Comm_free(ring, ierr)
  end subroutine test_neighbors

  subroutine test_pack()
    integer :: vals(k), back(k), pos, i
    character :: packed(64)
    integer(kind=MPI_ADDRESS_KIND) :: apos
    vals = (/ (i * 1000 + rank, i = 1, k) /)
    pos = 0
    call MPI_Pack(vals, k, MPI_INTEGER, packed, 64, pos, MPI_COMM_WORLD, ierr)
    call check(ierr == 0 .and. pos == 4 * k, 'Pack')
    pos = 0
    back = 0
    call MPI_Unpack(packed, 64, pos, back, k, MPI_INTEGER, MPI_COMM_WORLD, ierr)
    call check(ierr == 0 .and. all(back == vals), 'Unpack')
    apos = 0
    call MPI_Pack_external('external32', vals, k, MPI_INTEGER, packed, 64_MPI_ADDRESS_KIND, &
                           apos, ierr)
    call check(ierr == 0 .and. apos == 4 * k .and. ichar(packed(4)) == mod(1000 + rank, 256), &
               'Pack_external (big-endian)')
    apos = 0
    back = 0
    call MPI_Unpack_external('external32', packed, 64_MPI_ADDRESS_KIND, apos, back, k, &
                             MPI_INTEGER, ierr)
    call check(ierr == 0 .and. all(back == vals), 'Unpack_external')
  end subroutine test_pack

  subroutine test_one_sided()
    integer :: win, origin(k), res(k), right, left, i, req
    integer(kind=MPI_ADDRESS_KIND) :: wsize, zero
    integer(kind=MPI_ADDRESS_KIND) :: baseptr
    right = mod(rank + 1, nproc)
    left = mod(rank + nproc - 1, nproc)
    wsize = 4 * k
    zero = 0
    call MPI_Win_allocate(wsize, 4, MPI_INFO_NULL, MPI_COMM_WORLD, baseptr, win, ierr)
    call MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN, ierr)
    origin = (/ (rank * 100 + i, i = 1, k) /)
    call MPI_Win_fence(0, win, ierr)
    call MPI_Put(origin, k, MPI_INTEGER, right, zero, k, MPI_INTEGER, win, ierr)
    call check(as_expected(ierr), 'Put')
    call MPI_Win_fence(0, win, ierr)
    res = -1
    call MPI_Get(res, k, MPI_INTEGER, left, zero, k, MPI_INTEGER, win, ierr)
    call check(as_expected(ierr), 'Get')
    call MPI_Win_fence(0, win, ierr)
    ! left's window holds what left's left put there; unless refused
    if (.not. refused) call check(all(res == (/ (mod(left + nproc - 1, nproc) * 100 + i, &
                                                 i = 1, k) /)), 'Put then Get')
    call MPI_Accumulate(origin, k, MPI_INTEGER, right, zero, k, MPI_INTEGER, MPI_SUM, win, ierr)
    call check(as_expected(ierr), 'Accumulate')
    call MPI_Win_fence(0, win, ierr)
    call MPI_Win_lock_all(0, win, ierr)
    call MPI_Rget(res, k, MPI_INTEGER, right, zero, k, MPI_INTEGER, win, req, ierr)
    call check(as_expected(ierr), 'Rget')
    if (ierr == MPI_SUCCESS) call MPI_Wait(req, MPI_STATUS_IGNORE, ierr)
    call MPI_Fetch_and_op(origin, res, MPI_INTEGER, right, zero, MPI_SUM, win, ierr)
    call check(as_expected(ierr), 'Fetch_and_op')
    call MPI_Win_unlock_all(win, ierr)
    call MPI_Win_free(win, ierr)
  end subroutine test_one_sided

  subroutine test_file_io()
    integer :: fh, vals(k), back(k), i, req, st(MPI_STATUS_SIZE)
    integer(kind=MPI_OFFSET_KIND) :: off
    character(len=64) :: path
    integer :: id
    id = 0
    call system_clock(id)
    call MPI_Bcast(id, 1, MPI_INTEGER, 0, MPI_COMM_WORLD, ierr)
    write (path, '("/tmp/gpucoll-shim-f90-",I0,".bin")') id
    call MPI_File_open(MPI_COMM_WORLD, trim(path), MPI_MODE_CREATE + MPI_MODE_RDWR, &
                       MPI_INFO_NULL, fh, ierr)
    call check(ierr == 0, 'File_open')
    vals = (/ (rank * 10 + i, i = 1, k) /)
    off = 4 * k * rank
    call MPI_File_write_at(fh, off, vals, k, MPI_INTEGER, st, ierr)
    call check(as_expected(ierr), 'File_write_at')
    call MPI_File_sync(fh, ierr)
    call MPI_Barrier(MPI_COMM_WORLD, ierr)
    call MPI_File_sync(fh, ierr)
    back = 0
    call MPI_File_iread_at(fh, off, back, k, MPI_INTEGER, req, ierr)
    call check(as_expected(ierr), 'File_iread_at')
    if (ierr == MPI_SUCCESS) then
      call MPI_Wait(req, st, ierr)
      call check(all(back == vals), 'File_iread_at data')
    end if
    call MPI_File_read_at_all(fh, off, back, k, MPI_INTEGER, MPI_STATUS_IGNORE, ierr)
    call check(as_expected(ierr), 'File_read_at_all')
    call MPI_File_close(fh, ierr)
    call MPI_Barrier(MPI_COMM_WORLD, ierr)
    if (rank == 0) call MPI_File_delete(trim(path), MPI_INFO_NULL, ierr)
  end subroutine test_file_io

end program conformance
