//go:build !linux

package slessrt

import (
	"errors"
	"syscall"
)

// queuedBytes cannot be told here, so every call's answer waits for the readers.
func queuedBytes(syscall.RawConn) (int64, error) {
	return 0, errors.ErrUnsupported
}
