package slessrt

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
)

// net/http answers requests it cannot parse (bad request line or header, bad
// Content-Length, unsupported Transfer-Encoding or HTTP version, oversized
// header) itself, before any handler runs, with a plain-text body written to
// the connection in one Write. jsonErrorListener wraps accepted connections so
// those answers become the runtime's JSON error body like every other error.
//
// net/http's own error writes are recognised by their fixed header block:
// Content-Type first, then Connection, and no Date. A response written through
// a ResponseWriter always carries Date and has its headers sorted (Connection
// before Content-Type), so it can never match.
const netHTTPErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

type jsonErrorListener struct{ net.Listener }

func (l jsonErrorListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &jsonErrorConn{Conn: conn}, nil
}

type jsonErrorConn struct{ net.Conn }

func (c *jsonErrorConn) Write(p []byte) (int, error) {
	if replacement, ok := rewriteProtocolError(p); ok {
		if _, err := c.Conn.Write(replacement); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// CloseWrite keeps net/http's lingering close (FIN first, then close) working
// through the wrapper, so a client still sending gets the answer, not a reset.
func (c *jsonErrorConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

var protocolErrorTypes = map[int]string{
	http.StatusBadRequest:                   "BadRequest",
	http.StatusRequestHeaderFieldsTooLarge:  "HeaderTooLarge",
	http.StatusNotImplemented:               "NotImplemented",
	http.StatusHTTPVersionNotSupported:      "HTTPVersionNotSupported",
	http.StatusRequestEntityTooLarge:        "PayloadTooLarge",
	http.StatusExpectationFailed:            "ExpectationFailed",
	http.StatusRequestURITooLong:            "URITooLong",
	http.StatusMethodNotAllowed:             "MethodNotAllowed",
	http.StatusUnsupportedMediaType:         "UnsupportedMediaType",
	http.StatusLengthRequired:               "LengthRequired",
	http.StatusRequestedRangeNotSatisfiable: "RangeNotSatisfiable",
}

func rewriteProtocolError(p []byte) ([]byte, bool) {
	const prefix = "HTTP/1.1 "
	if len(p) < len(prefix)+3 || !bytes.HasPrefix(p, []byte(prefix)) || (p[9] != '4' && p[9] != '5') {
		return nil, false
	}
	statusLine, rest, found := bytes.Cut(p, []byte("\r\n"))
	if !found || !bytes.HasPrefix(rest, []byte(netHTTPErrorHeaders[2:])) {
		return nil, false
	}
	code, err := strconv.Atoi(string(statusLine[len(prefix) : len(prefix)+3]))
	if err != nil {
		return nil, false
	}
	message := string(bytes.TrimPrefix(rest[len(netHTTPErrorHeaders)-2:], statusLine[len(prefix):len(prefix)+4]))
	kind, known := protocolErrorTypes[code]
	if !known {
		kind = "HTTPError"
	}
	body, _ := json.Marshal(errorBody{Error: message, Type: kind}) // cannot fail: two strings
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, http.StatusText(code), appJSON, len(body), body), true
}
