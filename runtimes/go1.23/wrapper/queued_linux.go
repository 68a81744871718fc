package slessrt

import (
	"syscall"
	"unsafe"
)

// queuedBytes is how many bytes wait in a pipe (FIONREAD, named TIOCINQ in package syscall).
func queuedBytes(raw syscall.RawConn) (int64, error) {
	var n int32
	var errno syscall.Errno
	if err := raw.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
	}); err != nil {
		return 0, err
	}
	if errno != 0 {
		return 0, errno
	}
	return int64(n), nil
}
