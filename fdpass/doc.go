// Package fdpass receives the share message: the decoder's KV regions as
// file descriptors (SCM_RIGHTS) plus a JSON header describing them, over a
// unix socket (DESIGN §2 "shared", §3). It also has the sending side, used by
// the decoder simulator.
//
// # Socket
//
// onebitd listens on <slot-dir>/<stem>.sock: SOCK_STREAM, mode 0600, in a
// directory created 0700 (an existing directory is refused when group or
// others can write it, or another user owns it). The path must fit
// sockaddr_un: at most MaxPathLen (107) bytes; onebitd checks its slot
// directory at startup. Abstract names are refused. A socket file left by a
// crashed run is replaced when a connect on it is refused; a live socket or a
// file of another type is an error. Close unlinks the file it created
// (Listener.Removed reports whether it did).
//
// One connection carries one message. The receiver checks the peer with
// SO_PEERCRED (Conn.PeerCred).
//
// # Framing
//
// The decoder writes, in one sendmsg:
//
//	+----------------------+---------------------------+
//	| length: uint32 LE    | header: length bytes JSON |
//	+----------------------+---------------------------+
//	  control: one SCM_RIGHTS message with the region fds, in fd_index order
//
// It is a stream socket, so the receiver may see the bytes in several
// segments and keeps reading until it has 4+length bytes. The fds must arrive
// with the first segment; fds that arrive with a later segment are received,
// closed, and make the message fail (ErrStrayFDs). The receiver reads exactly
// 4+length bytes and nothing after them.
//
// # Header
//
// Example (schemas/share-header.json is the schema):
//
//	{"version": 1, "layout_hash": "hex", "n_ctx": 20480, "n_layer": 28,
//	 "kv_type_k": "f16", "kv_type_v": "f16", "flash_attn": true, "n_batch": 2048, "n_ubatch": 512,
//	 "regions": [{"fd_index": 0, "offset": 0, "size": 123456, "kind": "k", "layer": 0,
//	              "cell_stride": 1024}]}
//
// (the example's size is illustrative; a real region's size is a multiple of
// 4096, see below.)
//
//   - version: HeaderVersion (1). Checked first: any other value is
//     ErrVersion, whatever else the header holds.
//   - layout_hash: non-empty hex (at most 128 digits); onebitd compares it
//     with the layout it expects (not this package's job).
//   - n_ctx, n_layer, n_batch, n_ubatch: >= 0; kv_type_k, kv_type_v,
//     flash_attn: the decoder's cache configuration, passed to the provider.
//   - regions: at least one. Each region is a byte range of one passed fd:
//     fd_index in [0, number of fds); offset >= 0 and size > 0, both
//     multiples of RegionAlign (4096) so a provider can mmap them;
//     offset+size does not overflow; kind "k" or "v"; layer >= 0 and below
//     n_layer when n_layer > 0; cell_stride > 0 and size a multiple of it
//     (cell i of the region is at offset + i*cell_stride). Regions of one fd
//     do not overlap. When a passed fd is a regular file (a memfd), every
//     region in it must end within the file's size (Receive checks with
//     fstat, so a provider's mmap cannot fault past EOF).
//
// Region count need NOT equal fd count (DESIGN §2.3 says "region count = fd
// count", but a decoder packs e.g. 56 per-layer regions into 3 memfd chunks):
// the rule is that every fd_index is valid and every passed fd is used by at
// least one region. Unknown fields are refused (ErrBadHeader): a new field
// needs a new version.
//
// # Limits
//
//   - header length 1..MaxHeaderLen (64 KiB): 0 is ErrBadHeader, more is
//     ErrHeaderTooLarge; both are reported from the prefix alone, without
//     reading the header;
//   - at most maxFDs fds (the Receive argument, at most MaxFDs = 253, the
//     kernel's SCM_MAX_FD). The control buffer is CMSG_LEN(4*maxFDs) bytes,
//     not CMSG_SPACE: with an odd maxFDs the alignment padding of CMSG_SPACE
//     holds one more fd, which would arrive without MSG_CTRUNC. When the
//     decoder sends more, the kernel keeps what fits, closes the rest, sets
//     MSG_CTRUNC, and reports no error: Receive checks the flag and returns
//     ErrCtrunc (and, as a guard, also when more than maxFDs arrived).
//
// # Errors
//
// Receive returns, wrapping one sentinel (see errors.go) with the facts:
// ErrReceiveTimeout (deadline), ErrShortMessage (EOF before 4+length bytes),
// ErrHeaderTooLarge, ErrBadHeader (length 0, not JSON, wrong shape, unknown
// field, bad layout_hash, negative size field), ErrVersion, ErrRegion,
// ErrCtrunc, ErrTrunc (MSG_TRUNC, not expected on a stream socket),
// ErrStrayFDs, ErrControl (control data that cannot be parsed whole; the
// fds that could be read from it are closed all the same). recvmsg is retried on EINTR and waits for data in the Go
// runtime poller, not in a blocked thread.
//
// # Who closes what
//
//   - Receive uses MSG_CMSG_CLOEXEC, so no region fd leaks into a child by
//     accident; a provider gets them only through exec.Cmd.ExtraFiles.
//   - On any Receive error every fd that arrived is closed before it returns;
//     the kernel closes fds it dropped for MSG_CTRUNC and fds still queued
//     when the connection closes.
//   - On success the caller owns Message.Files and calls Message.Close when
//     the handoff ends, on every path; it returns the number it closed (the
//     event's cleanup.fds_closed). Conn.Close and Listener.Close do not touch
//     received files.
//   - The sender keeps its own fds: the kernel passes duplicates.
package fdpass
