package slessrt

import (
	"bufio"
	"context"
	"crypto/sha1" //nolint:gosec // RFC 6455 defines the handshake with SHA-1
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// WebSocket connections (runtimes/README.md, "WebSocket").
//
// An upgrade request reaches Handle like any request (event["_headers"]["upgrade"] is "websocket").
// A function that accepts the connection returns a session:
//
//	func(ctx context.Context, receive <-chan any, send chan<- any) error
//
// Messages are a string (a text frame) or a []byte (a binary frame). receive is closed when the
// client closes (or the connection breaks, or was idle for SLESS_TIMEOUT_SEC); ctx is cancelled then
// too. Returning closes the connection: nil with 1000, an error with a CloseCode() int method with
// that code (4000-4999 are the function's), any other error with 1011. Any other result of Handle
// refuses the upgrade with 400 WebSocketNotAccepted: deny by default.

// Session is what a handler returns to accept a WebSocket.
type Session = func(ctx context.Context, receive <-chan any, send chan<- any) error

const (
	wsGUID   = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
	opCont   = 0x0
	opText   = 0x1
	opBinary = 0x2
	opClose  = 0x8
	opPing   = 0x9
	opPong   = 0xA
)

func isUpgrade(r *http.Request) bool {
	return strings.EqualFold(strings.TrimSpace(r.Header.Get("Upgrade")), "websocket")
}

// closeError ends the reader with the close code the runtime answers with.
type closeError struct {
	code   int
	reason string
}

func (e *closeError) Error() string { return fmt.Sprintf("websocket closed (%d %s)", e.code, e.reason) }

type wsConn struct {
	conn    net.Conn
	rd      *bufio.Reader
	idle    time.Duration
	max     int64
	writeMu sync.Mutex
	closed  bool
}

func (c *wsConn) frame(opcode byte, payload []byte) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if c.closed {
		return net.ErrClosed
	}
	head := []byte{0x80 | opcode, 0}
	switch n := len(payload); {
	case n < 126:
		head[1] = byte(n)
	case n < 1<<16:
		head[1] = 126
		head = binary.BigEndian.AppendUint16(head, uint16(n))
	default:
		head[1] = 127
		head = binary.BigEndian.AppendUint64(head, uint64(n))
	}
	_ = c.conn.SetWriteDeadline(time.Now().Add(time.Minute))
	_, err := c.conn.Write(append(head, payload...))
	return err
}

// close sends a close frame once; later frames are dropped.
func (c *wsConn) close(code int, reason string) {
	payload := binary.BigEndian.AppendUint16(nil, uint16(code))
	if len(reason) > 123 {
		reason = reason[:123]
	}
	_ = c.frame(opClose, append(payload, reason...))
	c.writeMu.Lock()
	c.closed = true
	c.writeMu.Unlock()
}

// next reads frames until a whole message (string or []byte), answering pings.
func (c *wsConn) next() (any, error) {
	var parts []byte
	kind := -1
	for {
		_ = c.conn.SetReadDeadline(time.Now().Add(c.idle))
		var head [2]byte
		if _, err := io.ReadFull(c.rd, head[:]); err != nil {
			var timeout net.Error
			if errors.As(err, &timeout) && timeout.Timeout() {
				return nil, &closeError{1001, "idle timeout"}
			}
			return nil, err
		}
		fin, opcode, masked, length := head[0]&0x80 != 0, head[0]&0x0F, head[1]&0x80 != 0, uint64(head[1]&0x7F)
		if head[0]&0x70 != 0 || !masked {
			return nil, &closeError{1002, "protocol error"}
		}
		switch length {
		case 126:
			var ext [2]byte
			if _, err := io.ReadFull(c.rd, ext[:]); err != nil {
				return nil, err
			}
			length = uint64(binary.BigEndian.Uint16(ext[:]))
		case 127:
			var ext [8]byte
			if _, err := io.ReadFull(c.rd, ext[:]); err != nil {
				return nil, err
			}
			length = binary.BigEndian.Uint64(ext[:])
		}
		if opcode >= opClose && (length > 125 || !fin) {
			return nil, &closeError{1002, "protocol error"}
		}
		if uint64(len(parts))+length > uint64(c.max) {
			return nil, &closeError{1009, "message too big"}
		}
		var mask [4]byte
		if _, err := io.ReadFull(c.rd, mask[:]); err != nil {
			return nil, err
		}
		payload := make([]byte, length)
		if _, err := io.ReadFull(c.rd, payload); err != nil {
			return nil, err
		}
		for i := range payload {
			payload[i] ^= mask[i&3]
		}
		switch opcode {
		case opPing:
			_ = c.frame(opPong, payload)
			continue
		case opPong:
			continue
		case opClose:
			code := 1000
			if len(payload) >= 2 {
				code = int(binary.BigEndian.Uint16(payload))
			}
			return nil, &closeError{code, ""}
		case opCont:
			if kind < 0 {
				return nil, &closeError{1002, "protocol error"}
			}
		case opText, opBinary:
			if kind >= 0 {
				return nil, &closeError{1002, "protocol error"}
			}
			kind = int(opcode)
		default:
			return nil, &closeError{1002, "protocol error"}
		}
		parts = append(parts, payload...)
		if !fin {
			continue
		}
		if kind == opBinary {
			return parts, nil
		}
		if !utf8.Valid(parts) {
			return nil, &closeError{1007, "invalid UTF-8"}
		}
		return string(parts), nil
	}
}

// serveWebSocket upgrades the connection and runs the session until it returns or the client goes.
func (s *server) serveWebSocket(w http.ResponseWriter, r *http.Request, session Session, call *callContext) {
	key := strings.TrimSpace(r.Header.Get("Sec-WebSocket-Key"))
	if strings.TrimSpace(r.Header.Get("Sec-WebSocket-Version")) != "13" || len(key) != 24 {
		writeError(w, http.StatusBadRequest, "not a WebSocket version 13 handshake", "BadRequest")
		return
	}
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		writeError(w, http.StatusInternalServerError, "cannot take over the connection: "+err.Error(), "InternalError")
		return
	}
	defer conn.Close()
	sum := sha1.Sum([]byte(key + wsGUID)) //nolint:gosec // RFC 6455
	_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Accept: " + base64.StdEncoding.EncodeToString(sum[:]) + "\r\n\r\n")
	if rw.Flush() != nil {
		return
	}
	ws := &wsConn{conn: conn, rd: rw.Reader, idle: s.cfg.Timeout, max: s.cfg.MaxBodyBytes}
	ctx, cancel := context.WithCancel(context.WithoutCancel(call))
	defer cancel()
	receive, send := make(chan any), make(chan any)
	readerDone := make(chan error, 1)
	go func() { // client -> function; ends the session's ctx when the client is done
		defer close(receive)
		defer cancel()
		for {
			message, err := ws.next()
			if err != nil {
				readerDone <- err
				return
			}
			select {
			case receive <- message:
			case <-ctx.Done():
				readerDone <- ctx.Err()
				return
			}
		}
	}()
	writerDone := make(chan struct{})
	go func() { // function -> client
		defer close(writerDone)
		for message := range send {
			switch m := message.(type) {
			case string:
				_ = ws.frame(opText, []byte(m))
			case []byte:
				_ = ws.frame(opBinary, m)
			default:
				log.Printf("sless: websocket: dropped a message of type %T (send a string or a []byte)", message)
			}
		}
	}()
	sessionErr := runSession(ctx, session, receive, send)
	close(send)
	<-writerDone
	code, reason := 1000, ""
	select {
	case err := <-readerDone:
		var closed *closeError
		if errors.As(err, &closed) {
			code, reason = closed.code, closed.reason
			if code == 1005 || code == 1006 {
				code = 1000
			}
		}
	default:
	}
	var chosen interface{ CloseCode() int }
	switch {
	case errors.As(sessionErr, &chosen) && chosen.CloseCode() >= 1000 && chosen.CloseCode() <= 4999:
		code, reason = chosen.CloseCode(), safeString(sessionErr.Error)
	case sessionErr != nil:
		log.Printf("sless: %s: websocket handler failed: %v", r.URL.Path, sessionErr)
		code, reason = 1011, "the function failed"
	}
	ws.close(code, reason)
}

// runSession calls the session, a panic in it becoming an error.
func runSession(ctx context.Context, session Session, receive <-chan any, send chan<- any) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return session(ctx, receive, send)
}
