! ShardTensor from Fortran: `use shardtensor`.
!
! iso_c_binding interfaces to the C API (capi/include/shardtensor.h) and Fortran-friendly
! wrappers: the communicator is a Fortran MPI handle (integer), strings are character(*),
! fields are the solver's own real arrays (ghost cells included), errors come back as a
! Fortran string. Every function returns the C status (SHARDTENSOR_OK = 0 on success).
!
!   use shardtensor
!   type(shardtensor_patch) :: patch
!   type(c_ptr) :: session
!   real(c_double) :: u(0:nx+1, 0:ny+1, 0:nz+1), prediction(0:nx+1, 0:ny+1, 0:nz+1)
!   status = shardtensor_initialize()                       ! after MPI_Init
!   patch = shardtensor_patch(3, [gx, gy, gz], [x0, y0, z0], [nx, ny, nz], [1, 1, 1])
!   status = shardtensor_create(MPI_COMM_WORLD, patch, session, config="model.yaml", &
!                               ghost_width=1)              ! Fortran order is the default
!   status = shardtensor_train_step(session, u, u_later, loss)
!   status = shardtensor_infer(session, u, prediction)
!   if (status /= SHARDTENSOR_OK) print *, shardtensor_last_error()
!   status = shardtensor_destroy(session)
!   status = shardtensor_finalize()                         ! before MPI_Finalize
!
! Patch offsets are 0-based cell numbers, axes in the order the arrays are indexed.
! The C function shardtensor_create takes a C MPI_Comm, which has no portable Fortran type;
! Fortran calls shardtensor_create_f (raw) or the wrapper shardtensor_create (integer handle).
module shardtensor
  use, intrinsic :: iso_c_binding
  implicit none
  private

  integer(c_int), parameter, public :: SHARDTENSOR_OK = 0
  integer(c_int), parameter, public :: SHARDTENSOR_ERROR_INVALID_ARGUMENT = 1
  integer(c_int), parameter, public :: SHARDTENSOR_ERROR_NOT_INITIALIZED = 2
  integer(c_int), parameter, public :: SHARDTENSOR_ERROR_FAILED = 3
  integer(c_int), parameter, public :: SHARDTENSOR_ORDER_C = 0
  integer(c_int), parameter, public :: SHARDTENSOR_ORDER_FORTRAN = 1

  !> This rank's patch (struct shardtensor_patch). Offsets are 0-based.
  type, bind(C), public :: shardtensor_patch
    integer(c_int) :: ndims = 3
    integer(c_int64_t) :: global_extent(3) = 0
    integer(c_int64_t) :: offset(3) = 0
    integer(c_int64_t) :: extent(3) = 0
    integer(c_int) :: periodic(3) = 0
  end type shardtensor_patch

  !> struct shardtensor_options; the strings are C pointers to null-terminated text (the
  !> wrapper shardtensor_create fills them from character(*) arguments).
  type, bind(C), public :: shardtensor_options
    type(c_ptr) :: config = c_null_ptr
    type(c_ptr) :: config_text = c_null_ptr
    type(c_ptr) :: checkpoint = c_null_ptr
    integer(c_int64_t) :: input_channels = 1
    integer(c_int64_t) :: output_channels = 1
    integer(c_int) :: array_order = SHARDTENSOR_ORDER_C
    integer(c_int64_t) :: ghost_width = 0
    integer(c_int64_t) :: boundary_ghost_width = -1
    integer(c_int64_t) :: ghost_lower(3) = -1
    integer(c_int64_t) :: ghost_upper(3) = -1
    integer(c_int64_t) :: components = 1
    type(c_ptr) :: overrides = c_null_ptr
    integer(c_int) :: noverrides = 0
  end type shardtensor_options

  ! Raw C functions usable from Fortran as they are.
  public :: shardtensor_initialize, shardtensor_finalize, shardtensor_options_default
  public :: shardtensor_create_f, shardtensor_destroy
  public :: shardtensor_infer_double, shardtensor_infer_float
  public :: shardtensor_train_step_double, shardtensor_train_step_float
  public :: shardtensor_last_call_copied, shardtensor_steps
  ! Fortran wrappers.
  public :: shardtensor_create, shardtensor_infer, shardtensor_train_step
  public :: shardtensor_save_checkpoint, shardtensor_load_checkpoint, shardtensor_last_error
  public :: shardtensor_last_call_copy_reason

  interface
    integer(c_int) function shardtensor_initialize() bind(C, name="shardtensor_initialize")
      import :: c_int
    end function
    integer(c_int) function shardtensor_finalize() bind(C, name="shardtensor_finalize")
      import :: c_int
    end function
    type(c_ptr) function c_last_error() bind(C, name="shardtensor_last_error")
      import :: c_ptr
    end function
    subroutine shardtensor_options_default(options) bind(C, name="shardtensor_options_default")
      import :: shardtensor_options
      type(shardtensor_options), intent(out) :: options
    end subroutine
    !> comm: a Fortran MPI handle (MPI_Fint); session receives the new handle.
    integer(c_int) function shardtensor_create_f(comm, patch, options, session) &
        bind(C, name="shardtensor_create_f")
      import :: c_int, c_ptr, shardtensor_patch, shardtensor_options
      integer(c_int), value :: comm
      type(shardtensor_patch), intent(in) :: patch
      type(shardtensor_options), intent(in) :: options
      type(c_ptr), intent(out) :: session
    end function
    !> Frees the session and sets it to c_null_ptr. Collective.
    integer(c_int) function shardtensor_destroy(session) bind(C, name="shardtensor_destroy")
      import :: c_int, c_ptr
      type(c_ptr), intent(inout) :: session
    end function
    !> inputs, outputs: c_loc of each channel's array.
    integer(c_int) function shardtensor_infer_double(session, inputs, ninputs, outputs, noutputs) &
        bind(C, name="shardtensor_infer_double")
      import :: c_int, c_ptr
      type(c_ptr), value :: session
      type(c_ptr), intent(in) :: inputs(*), outputs(*)
      integer(c_int), value :: ninputs, noutputs
    end function
    integer(c_int) function shardtensor_infer_float(session, inputs, ninputs, outputs, noutputs) &
        bind(C, name="shardtensor_infer_float")
      import :: c_int, c_ptr
      type(c_ptr), value :: session
      type(c_ptr), intent(in) :: inputs(*), outputs(*)
      integer(c_int), value :: ninputs, noutputs
    end function
    integer(c_int) function shardtensor_train_step_double(session, inputs, ninputs, targets, &
                                                          ntargets, loss) &
        bind(C, name="shardtensor_train_step_double")
      import :: c_int, c_ptr, c_double
      type(c_ptr), value :: session
      type(c_ptr), intent(in) :: inputs(*), targets(*)
      integer(c_int), value :: ninputs, ntargets
      real(c_double), intent(out), optional :: loss  ! absent: NULL
    end function
    integer(c_int) function shardtensor_train_step_float(session, inputs, ninputs, targets, &
                                                         ntargets, loss) &
        bind(C, name="shardtensor_train_step_float")
      import :: c_int, c_ptr, c_double
      type(c_ptr), value :: session
      type(c_ptr), intent(in) :: inputs(*), targets(*)
      integer(c_int), value :: ninputs, ntargets
      real(c_double), intent(out), optional :: loss  ! absent: NULL
    end function
    integer(c_int) function c_save_checkpoint(session, path) &
        bind(C, name="shardtensor_save_checkpoint")
      import :: c_int, c_ptr, c_char
      type(c_ptr), value :: session
      character(kind=c_char), intent(in) :: path(*)
    end function
    integer(c_int) function c_load_checkpoint(session, path) &
        bind(C, name="shardtensor_load_checkpoint")
      import :: c_int, c_ptr, c_char
      type(c_ptr), value :: session
      character(kind=c_char), intent(in) :: path(*)
    end function
    integer(c_int) function shardtensor_last_call_copied(session, copied) &
        bind(C, name="shardtensor_last_call_copied")
      import :: c_int, c_ptr
      type(c_ptr), value :: session
      integer(c_int), intent(out) :: copied
    end function
    integer(c_int) function c_last_call_copy_reason(session, reason) &
        bind(C, name="shardtensor_last_call_copy_reason")
      import :: c_int, c_ptr
      type(c_ptr), value :: session
      type(c_ptr), intent(out) :: reason
    end function
    integer(c_int) function shardtensor_steps(session, steps) bind(C, name="shardtensor_steps")
      import :: c_int, c_ptr, c_int64_t
      type(c_ptr), value :: session
      integer(c_int64_t), intent(out) :: steps
    end function
    function c_strlen(text) bind(C, name="strlen")
      import :: c_ptr, c_size_t
      type(c_ptr), value :: text
      integer(c_size_t) :: c_strlen
    end function
  end interface

  !> shardtensor_infer(session, input, output): one input and one output channel, the
  !> solver's arrays (rank 1 to 3, real(c_double) or real(c_float), ghost cells included).
  !> Only the owned cells of output are written.
  interface shardtensor_infer
    module procedure infer_double_1, infer_double_2, infer_double_3
    module procedure infer_float_1, infer_float_2, infer_float_3
  end interface
  !> shardtensor_train_step(session, input, target_field [, loss]): one optimizer step on a pair.
  interface shardtensor_train_step
    module procedure train_double_1, train_double_2, train_double_3
    module procedure train_float_1, train_float_2, train_float_3
  end interface

contains

  !> The message of the last failed call on this thread ("" if none).
  function shardtensor_last_error() result(message)
    character(len=:), allocatable :: message
    message = fortran_string(c_last_error())
  end function

  !> Why the last infer or train_step copied the inputs ("" if it read them in place).
  integer(c_int) function shardtensor_last_call_copy_reason(session, reason) result(status)
    type(c_ptr), intent(in) :: session
    character(len=:), allocatable, intent(out) :: reason
    type(c_ptr) :: text
    status = c_last_call_copy_reason(session, text)
    reason = ""
    if (status == SHARDTENSOR_OK) reason = fortran_string(text)
  end function

  !> A null-terminated C string as a Fortran string.
  function fortran_string(text) result(message)
    type(c_ptr), intent(in) :: text
    character(len=:), allocatable :: message
    character(kind=c_char), pointer :: chars(:)
    integer :: i, n
    n = int(c_strlen(text))
    call c_f_pointer(text, chars, [n])
    allocate(character(len=n) :: message)
    do i = 1, n
      message(i:i) = chars(i)
    end do
  end function

  !> text as a null-terminated C string (trailing blanks removed).
  pure function c_string(text) result(out)
    character(*), intent(in) :: text
    character(kind=c_char, len=:), allocatable :: out
    out = trim(text) // c_null_char
  end function

  !> Creates a session on the solver's communicator (a Fortran MPI handle, e.g. a Cartesian
  !> communicator) and patch. Give config (a YAML file), config_text or checkpoint.
  !> array_order defaults to SHARDTENSOR_ORDER_FORTRAN, channels to 1, ghost_width to 0;
  !> boundary_ghost_width, ghost_lower/ghost_upper (this rank's widths per axis) and
  !> components as in shardtensor_options (capi/include/shardtensor.h); overrides: config
  !> "key=value" strings (trailing blanks removed). The generic shardtensor_infer and
  !> shardtensor_train_step take one whole array per channel: with components > 1 call
  !> shardtensor_infer_double (and the others) with c_loc of each component's first value.
  integer(c_int) function shardtensor_create(comm, patch, session, config, config_text, &
                                             checkpoint, input_channels, output_channels, &
                                             array_order, ghost_width, boundary_ghost_width, &
                                             ghost_lower, ghost_upper, components, overrides) &
                                             result(status)
    integer, intent(in) :: comm
    type(shardtensor_patch), intent(in) :: patch
    type(c_ptr), intent(out) :: session
    character(*), intent(in), optional :: config, config_text, checkpoint
    integer, intent(in), optional :: input_channels, output_channels, array_order, ghost_width
    integer, intent(in), optional :: boundary_ghost_width, components
    integer, intent(in), optional :: ghost_lower(:), ghost_upper(:)
    character(*), intent(in), optional :: overrides(:)
    ! The strings must outlive the call: allocatable targets local to this function.
    character(kind=c_char, len=:), allocatable, target :: config_c, text_c, checkpoint_c
    character(kind=c_char, len=:), allocatable, target :: override_c(:)
    type(c_ptr), allocatable, target :: override_ptr(:)
    type(shardtensor_options) :: options
    integer :: i, n
    call shardtensor_options_default(options)
    options%array_order = SHARDTENSOR_ORDER_FORTRAN
    if (present(config)) then
      config_c = c_string(config)
      options%config = c_loc(config_c)
    end if
    if (present(config_text)) then
      text_c = c_string(config_text)
      options%config_text = c_loc(text_c)
    end if
    if (present(checkpoint)) then
      checkpoint_c = c_string(checkpoint)
      options%checkpoint = c_loc(checkpoint_c)
    end if
    if (present(input_channels)) options%input_channels = input_channels
    if (present(output_channels)) options%output_channels = output_channels
    if (present(array_order)) options%array_order = array_order
    if (present(ghost_width)) options%ghost_width = ghost_width
    if (present(boundary_ghost_width)) options%boundary_ghost_width = boundary_ghost_width
    if (present(components)) options%components = components
    if (present(ghost_lower)) then
      n = min(size(ghost_lower), 3)
      options%ghost_lower(1:n) = ghost_lower(1:n)
    end if
    if (present(ghost_upper)) then
      n = min(size(ghost_upper), 3)
      options%ghost_upper(1:n) = ghost_upper(1:n)
    end if
    if (present(overrides)) then
      n = size(overrides)
      allocate(character(kind=c_char, len=len(overrides) + 1) :: override_c(n))
      allocate(override_ptr(max(n, 1)))
      do i = 1, n
        override_c(i) = c_string(overrides(i))
        override_ptr(i) = c_loc(override_c(i))
      end do
      options%overrides = c_loc(override_ptr)
      options%noverrides = int(n, c_int)
    end if
    status = shardtensor_create_f(int(comm, c_int), patch, options, session)
  end function

  integer(c_int) function shardtensor_save_checkpoint(session, path) result(status)
    type(c_ptr), intent(in) :: session
    character(*), intent(in) :: path
    status = c_save_checkpoint(session, c_string(path))
  end function

  integer(c_int) function shardtensor_load_checkpoint(session, path) result(status)
    type(c_ptr), intent(in) :: session
    character(*), intent(in) :: path
    status = c_load_checkpoint(session, c_string(path))
  end function

  ! One channel in, one out, by address: what every rank- and kind-specific wrapper calls.
  integer(c_int) function infer_one(session, input, output, is_double) result(status)
    type(c_ptr), intent(in) :: session, input, output
    logical, intent(in) :: is_double
    type(c_ptr) :: inputs(1), outputs(1)
    inputs(1) = input
    outputs(1) = output
    if (is_double) then
      status = shardtensor_infer_double(session, inputs, 1_c_int, outputs, 1_c_int)
    else
      status = shardtensor_infer_float(session, inputs, 1_c_int, outputs, 1_c_int)
    end if
  end function

  integer(c_int) function train_one(session, input, target_field, is_double, loss) result(status)
    type(c_ptr), intent(in) :: session, input, target_field
    logical, intent(in) :: is_double
    real(c_double), intent(out), optional :: loss
    type(c_ptr) :: inputs(1), targets(1)
    real(c_double) :: value
    inputs(1) = input
    targets(1) = target_field
    if (is_double) then
      status = shardtensor_train_step_double(session, inputs, 1_c_int, targets, 1_c_int, value)
    else
      status = shardtensor_train_step_float(session, inputs, 1_c_int, targets, 1_c_int, value)
    end if
    if (present(loss)) loss = value
  end function

  ! The specific procedures: `contiguous` makes the compiler pass a contiguous copy of an
  ! array section (and copy an output back), so c_loc is the address the C side expects.
  integer(c_int) function infer_double_1(session, input, output) result(status)
    type(c_ptr), intent(in) :: session
    real(c_double), intent(in), contiguous, target :: input(:)
    real(c_double), intent(inout), contiguous, target :: output(:)
    status = infer_one(session, c_loc(input), c_loc(output), .true.)
  end function
  integer(c_int) function infer_double_2(session, input, output) result(status)
    type(c_ptr), intent(in) :: session
    real(c_double), intent(in), contiguous, target :: input(:, :)
    real(c_double), intent(inout), contiguous, target :: output(:, :)
    status = infer_one(session, c_loc(input), c_loc(output), .true.)
  end function
  integer(c_int) function infer_double_3(session, input, output) result(status)
    type(c_ptr), intent(in) :: session
    real(c_double), intent(in), contiguous, target :: input(:, :, :)
    real(c_double), intent(inout), contiguous, target :: output(:, :, :)
    status = infer_one(session, c_loc(input), c_loc(output), .true.)
  end function
  integer(c_int) function infer_float_1(session, input, output) result(status)
    type(c_ptr), intent(in) :: session
    real(c_float), intent(in), contiguous, target :: input(:)
    real(c_float), intent(inout), contiguous, target :: output(:)
    status = infer_one(session, c_loc(input), c_loc(output), .false.)
  end function
  integer(c_int) function infer_float_2(session, input, output) result(status)
    type(c_ptr), intent(in) :: session
    real(c_float), intent(in), contiguous, target :: input(:, :)
    real(c_float), intent(inout), contiguous, target :: output(:, :)
    status = infer_one(session, c_loc(input), c_loc(output), .false.)
  end function
  integer(c_int) function infer_float_3(session, input, output) result(status)
    type(c_ptr), intent(in) :: session
    real(c_float), intent(in), contiguous, target :: input(:, :, :)
    real(c_float), intent(inout), contiguous, target :: output(:, :, :)
    status = infer_one(session, c_loc(input), c_loc(output), .false.)
  end function

  integer(c_int) function train_double_1(session, input, target_field, loss) result(status)
    type(c_ptr), intent(in) :: session
    real(c_double), intent(in), contiguous, target :: input(:), target_field(:)
    real(c_double), intent(out), optional :: loss
    status = train_one(session, c_loc(input), c_loc(target_field), .true., loss)
  end function
  integer(c_int) function train_double_2(session, input, target_field, loss) result(status)
    type(c_ptr), intent(in) :: session
    real(c_double), intent(in), contiguous, target :: input(:, :), target_field(:, :)
    real(c_double), intent(out), optional :: loss
    status = train_one(session, c_loc(input), c_loc(target_field), .true., loss)
  end function
  integer(c_int) function train_double_3(session, input, target_field, loss) result(status)
    type(c_ptr), intent(in) :: session
    real(c_double), intent(in), contiguous, target :: input(:, :, :), target_field(:, :, :)
    real(c_double), intent(out), optional :: loss
    status = train_one(session, c_loc(input), c_loc(target_field), .true., loss)
  end function
  integer(c_int) function train_float_1(session, input, target_field, loss) result(status)
    type(c_ptr), intent(in) :: session
    real(c_float), intent(in), contiguous, target :: input(:), target_field(:)
    real(c_double), intent(out), optional :: loss
    status = train_one(session, c_loc(input), c_loc(target_field), .false., loss)
  end function
  integer(c_int) function train_float_2(session, input, target_field, loss) result(status)
    type(c_ptr), intent(in) :: session
    real(c_float), intent(in), contiguous, target :: input(:, :), target_field(:, :)
    real(c_double), intent(out), optional :: loss
    status = train_one(session, c_loc(input), c_loc(target_field), .false., loss)
  end function
  integer(c_int) function train_float_3(session, input, target_field, loss) result(status)
    type(c_ptr), intent(in) :: session
    real(c_float), intent(in), contiguous, target :: input(:, :, :), target_field(:, :, :)
    real(c_double), intent(out), optional :: loss
    status = train_one(session, c_loc(input), c_loc(target_field), .false., loss)
  end function

end module shardtensor
