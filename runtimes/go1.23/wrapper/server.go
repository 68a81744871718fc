package slessrt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// server answers every request: the reserved /_/ paths itself, all others
// through the user's handler.
type server struct {
	cfg     Config
	handler Handler
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/_/") {
		s.reserved(w, r)
		return
	}

	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	out := outputTags.newCall(callIDFrom(r.Header.Get("X-Request-Id")))
	ctx := withCallOutput(r.Context(), out)
	began := time.Now()
	result, call, fail := invoke(ctx, s.handler, buildEvent(r, body), s.cfg)
	defer call.stop(context.Canceled) // the call is over once it is answered
	handlerMs := millis(began)
	if fail != nil {
		if fail.kind == kindCanceled { // nobody is left to read a response
			return
		}
		// Before the log line: a timed-out handler still runs, and the line would be its.
		handlerHeaders(w.Header(), handlerMs, out)
		if fail.kind != kindPanic { // a panic was logged with its stack already
			log.Printf("sless: %s %s: %s: %s", r.Method, r.URL.Path, fail.kind, fail.message)
		}
		writeError(w, fail.status, fail.message, fail.kind)
		return
	}
	if isUpgrade(r) {
		// Deny by default: only a handler that returns a Session accepts the WebSocket.
		if session, ok := result.(Session); ok {
			s.serveWebSocket(w, r, session, call)
			return
		}
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusBadRequest,
			"this function does not accept WebSocket connections (its handler returned no websocket session)",
			"WebSocketNotAccepted")
		return
	}
	resp, stream, err := renderResult(result)
	if err == nil && stream != nil {
		s.writeStream(w, r, resp, stream, call, began)
		return
	}
	if err != nil {
		log.Printf("sless: invalid result: %v", err)
		handlerHeaders(w.Header(), handlerMs, out)
		writeError(w, http.StatusInternalServerError, err.Error(), "InvalidResponse")
		return
	}
	handlerHeaders(resp.header, handlerMs, out) // the platform's, never the handler's
	writeResponse(w, r, resp)
}

// readBody enforces SLESS_MAX_BODY_BYTES: a declared Content-Length over the
// limit is refused before reading anything, a chunked body once it grows past it.
func (s *server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	limit := s.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		tooLarge(w, limit)
		return nil, false
	}
	if r.ContentLength == 0 {
		return nil, true
	}
	var body []byte
	var err error
	if r.ContentLength > 0 {
		body = make([]byte, r.ContentLength)
		_, err = io.ReadFull(r.Body, body)
	} else {
		body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	}
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			tooLarge(w, limit)
		} else {
			writeError(w, http.StatusBadRequest, "cannot read the request body: "+err.Error(), "BadRequest")
		}
		return nil, false
	}
	return body, true
}

// tooLarge answers 413 and closes the connection without reading the rest of
// the body. The read deadline in the past stops net/http from draining the
// body after the handler returns, which would wait forever on a client that
// stalls mid-stream (a chunked body has no length to judge by).
func tooLarge(w http.ResponseWriter, limit int64) {
	w.Header().Set("Connection", "close")
	writeError(w, http.StatusRequestEntityTooLarge,
		fmt.Sprintf("request body exceeds %d bytes", limit), "PayloadTooLarge")
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
}

func (s *server) reserved(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/_/health" {
		writeError(w, http.StatusNotFound, "no such reserved path: "+r.URL.Path, "NotFound")
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, "use GET", "MethodNotAllowed")
		return
	}
	writeResponse(w, r, &response{status: http.StatusOK, header: contentType(appJSON), body: []byte(`{"status":"ok"}`)})
}

func writeResponse(w http.ResponseWriter, r *http.Request, resp *response) {
	header := w.Header()
	for name, values := range resp.header {
		header[name] = values
	}
	bodyAllowed := resp.status != http.StatusNoContent && resp.status != http.StatusNotModified
	if bodyAllowed {
		header.Set("Content-Length", strconv.Itoa(len(resp.body)))
	}
	w.WriteHeader(resp.status)
	if bodyAllowed && r.Method != http.MethodHead && len(resp.body) > 0 {
		_, _ = w.Write(resp.body) // a failed write means the client is gone
	}
}

type errorBody struct {
	Error string `json:"error"`
	Type  string `json:"type"`
}

func writeError(w http.ResponseWriter, status int, message, kind string) {
	body, _ := json.Marshal(errorBody{Error: message, Type: kind}) // cannot fail: two strings
	header := w.Header()
	header.Set("Content-Type", appJSON)
	header.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// serve listens until SIGTERM (or SIGINT), then drains (see drain) and returns
// the exit code.
func serve(cfg Config, h Handler) int {
	tags, err := startTagging()
	if err != nil {
		log.Printf("sless: cannot tag the output of calls: %v", err)
	}
	outputTags = tags
	defer tags.close()
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)))
	if err != nil {
		log.Printf("sless: %v", err)
		return 1
	}
	srv := &http.Server{
		// AllowQuerySemicolons only silences net/http's per-request log line;
		// the event's _query is parsed from the untouched request line.
		Handler:           http.AllowQuerySemicolons(&server{cfg: cfg, handler: h}),
		ReadHeaderTimeout: time.Minute,
		MaxHeaderBytes:    64 << 10,
		IdleTimeout:       10 * time.Minute, // longer than any upstream keep-alive pool
		ErrorLog:          log.New(os.Stderr, "sless: http: ", log.LstdFlags),
	}
	code := 0
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, os.Interrupt)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(jsonErrorListener{ln}) }()
	log.Printf("sless: go runtime listening on http://%s (timeout %ss)", ln.Addr(), cfg.TimeoutText)
	select {
	case err := <-served:
		log.Printf("sless: server stopped: %v", err)
		return 1
	case sig := <-signals:
		log.Printf("sless: %v: draining in-flight requests for up to %v", sig, cfg.Drain)
	case <-recycle:
		code = recycleExit
		log.Printf("sless: draining in-flight requests for up to %v before the recycle", cfg.Drain)
	}
	drain(srv, cfg)
	log.Printf("sless: stopped")
	return code
}

// drain closes idle keep-alive connections and answers every request from now
// on with Connection: close, keeps accepting new connections for
// cfg.DrainListen (a pod sets it: the nodes' Service rules still send it
// connections a while after it was told to stop, and a closed listener would
// refuse them), then stops accepting and waits for in-flight requests, all
// within cfg.Drain from the signal.
func drain(srv *http.Server, cfg Config) {
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Drain)
	defer cancel()
	srv.SetKeepAlivesEnabled(false)
	time.Sleep(cfg.DrainListen) // still accepting meanwhile
	if err := srv.Shutdown(ctx); err != nil {
		log.Printf("sless: drain deadline passed, closing the remaining connections")
		_ = srv.Close()
	}
}
