package fdpass

import "errors"

// Sentinel errors. Every error returned by this package wraps exactly one of
// them (match with errors.Is); the wrapped text adds the facts (path, byte and
// fd counts, region index). Their texts are sentences a user can read: onebitd
// logs them as the reason of a fallback.
var (
	// Listen.

	// ErrPathTooLong: the socket path does not fit a sockaddr_un (see MaxPathLen).
	ErrPathTooLong = errors.New("fdpass: the socket path is longer than the 107 bytes a unix socket address can hold; choose a shorter slot directory")
	// ErrAbstractName: a name that would make an abstract socket ('@' or NUL).
	ErrAbstractName = errors.New("fdpass: abstract unix socket names are refused; the share socket must be a file in the slot directory")
	// ErrBadName: an empty name, ".", "..", or a name containing '/'.
	ErrBadName = errors.New("fdpass: the socket name must be a plain file name")
	// ErrNotSocket: something other than a socket already exists at the socket path.
	ErrNotSocket = errors.New("fdpass: a file that is not a socket is in the way of the share socket")
	// ErrSocketInUse: a live process answers on the socket path.
	ErrSocketInUse = errors.New("fdpass: another process is already listening on the share socket")
	// ErrInsecureDir: the socket directory is writable by other users or owned by another user.
	ErrInsecureDir = errors.New("fdpass: the socket directory is writable by other users or not owned by this user")

	// Accept and Receive.

	// ErrAcceptTimeout: no decoder connected before the deadline.
	ErrAcceptTimeout = errors.New("fdpass: the decoder did not connect to the share socket in time")
	// ErrReceiveTimeout: the decoder connected but did not send the whole message before the deadline.
	ErrReceiveTimeout = errors.New("fdpass: the decoder did not send the share message in time")
	// ErrCtrunc: the kernel dropped fds that did not fit the control buffer.
	ErrCtrunc = errors.New("fdpass: the decoder sent more region fds than this process accepts (kernel set MSG_CTRUNC)")
	// ErrTrunc: the kernel truncated the data of a segment.
	ErrTrunc = errors.New("fdpass: the share message was truncated by the kernel (MSG_TRUNC)")
	// ErrShortMessage: the decoder closed the connection before the whole message arrived.
	ErrShortMessage = errors.New("fdpass: the decoder closed the share socket before sending the whole message")
	// ErrHeaderTooLarge: the length prefix exceeds MaxHeaderLen.
	ErrHeaderTooLarge = errors.New("fdpass: the decoder announced a share header larger than this process accepts")
	// ErrControl: the control data of a segment could not be parsed whole
	// (the fds that could be read from it are closed all the same).
	ErrControl = errors.New("fdpass: the share message's control data (the region fds) could not be parsed")
	// ErrStrayFDs: fds arrived with a later segment than the first one.
	ErrStrayFDs = errors.New("fdpass: the decoder sent region fds after the start of the share message")

	// Header.

	// ErrBadHeader: empty, not JSON, wrong shape, or a field out of range.
	ErrBadHeader = errors.New("fdpass: the decoder sent a share header that is not valid")
	// ErrVersion: a header version other than HeaderVersion.
	ErrVersion = errors.New("fdpass: the decoder speaks a share header version this onebitd does not understand")
	// ErrRegion: a region that does not fit the passed fds (index, alignment, size, stride, overlap), an fd no region uses, or no region at all.
	ErrRegion = errors.New("fdpass: the share header's regions do not match the passed fds")
)
