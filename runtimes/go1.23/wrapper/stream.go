package slessrt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Streamed responses (runtimes/README.md, "Streaming").
//
// A handler streams by returning, as its result or as the "body" of a response
// description, one of:
//
//   - <-chan []byte or <-chan string (also chan ...): each value received is one
//     chunk, sent at once; the stream ends when the handler closes the channel.
//   - io.Reader: each Read's bytes are sent at once, until io.EOF; another error
//     cuts the stream. An io.Closer is closed when the stream ends for any reason.
//
// The handler's ctx stays alive while the stream runs: it is cancelled when the
// stream ends, when the client goes away, or when no chunk came for
// SLESS_TIMEOUT_SEC (ctx.Err() is then context.DeadlineExceeded). Producers
// select on ctx.Done() so that they stop with it.

// chunk is one piece of a stream, or the error that broke it.
type chunk struct {
	data []byte
	err  error
}

// streamBody is a handler's streamed body: text says whether its chunks are
// strings (text/plain by default) or bytes (application/octet-stream).
type streamBody struct {
	text bool
	pump func(ctx context.Context) <-chan chunk // closed at the end of the stream
	stop func()                                 // releases what the producer holds (closes a reader)
}

// asStream is the stream a value is, or nil when it is an ordinary value.
func asStream(v any) *streamBody {
	switch s := v.(type) {
	case <-chan []byte:
		return &streamBody{pump: fromChannel(s, func(b []byte) []byte { return b }), stop: func() {}}
	case chan []byte:
		return &streamBody{pump: fromChannel((<-chan []byte)(s), func(b []byte) []byte { return b }), stop: func() {}}
	case <-chan string:
		return &streamBody{text: true, pump: fromChannel(s, func(t string) []byte { return []byte(t) }), stop: func() {}}
	case chan string:
		return &streamBody{text: true, pump: fromChannel((<-chan string)(s), func(t string) []byte { return []byte(t) }),
			stop: func() {}}
	case io.Reader:
		stop := func() {}
		if closer, ok := s.(io.Closer); ok {
			var once sync.Once
			stop = func() { once.Do(func() { _ = closer.Close() }) }
		}
		return &streamBody{pump: fromReader(s), stop: stop}
	}
	return nil
}

// fromChannel forwards a handler's channel until it is closed or ctx ends.
func fromChannel[T any](in <-chan T, bytesOf func(T) []byte) func(context.Context) <-chan chunk {
	return func(ctx context.Context) <-chan chunk {
		out := make(chan chunk)
		go func() {
			defer close(out)
			for {
				select {
				case v, ok := <-in:
					if !ok {
						return
					}
					select {
					case out <- chunk{data: bytesOf(v)}:
					case <-ctx.Done():
						return
					}
				case <-ctx.Done():
					return
				}
			}
		}()
		return out
	}
}

// fromReader reads a handler's reader until io.EOF, an error, or ctx ends (a
// Read that blocks ends when the stream's stop closes the reader).
func fromReader(r io.Reader) func(context.Context) <-chan chunk {
	return func(ctx context.Context) <-chan chunk {
		out := make(chan chunk)
		go func() {
			defer close(out)
			buf := make([]byte, 32<<10)
			for {
				n, err := r.Read(buf)
				if n > 0 {
					select {
					case out <- chunk{data: append([]byte(nil), buf[:n]...)}:
					case <-ctx.Done():
						return
					}
				}
				if errors.Is(err, io.EOF) {
					return
				}
				if err != nil {
					select {
					case out <- chunk{err: err}:
					case <-ctx.Done():
					}
					return
				}
			}
		}()
		return out
	}
}

// callContext is the handler's ctx: cancelled when the client goes away, when
// the call ends, or when it was idle for the timeout: until the handler
// returns, then (for a stream) between two chunks. Its deadline moves forward
// with every chunk, which a context.WithTimeout cannot do.
type callContext struct {
	context.Context // the request's: values, and its cancellation when the client goes away
	idle            time.Duration
	done            chan struct{}
	mu              sync.Mutex
	err             error
	deadline        time.Time
	timer           *time.Timer
	unwatch         func() bool
}

func newCallContext(parent context.Context, idle time.Duration) *callContext {
	c := &callContext{Context: parent, idle: idle, done: make(chan struct{}), deadline: time.Now().Add(idle)}
	// Held while the two are set: either may fire at once (a tiny idle time, a parent already done), and its
	// stop must find both assigned.
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timer = time.AfterFunc(idle, func() { c.stop(context.DeadlineExceeded) })
	c.unwatch = context.AfterFunc(parent, func() { c.stop(context.Cause(parent)) })
	return c
}

func (c *callContext) Deadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadline, true
}

func (c *callContext) Done() <-chan struct{} { return c.done }

func (c *callContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// stop cancels the call with err (the first reason wins).
func (c *callContext) stop(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	if err == nil {
		err = context.Canceled
	}
	c.err = err
	close(c.done)
	c.timer.Stop()
	c.unwatch()
}

// touch restarts the idle time: a chunk has just come.
func (c *callContext) touch() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.deadline = time.Now().Add(c.idle)
		c.timer.Reset(c.idle)
	}
}

// writeStream sends a streamed result chunk by chunk, each flushed at once
// (chunked transfer encoding). The head goes out with the first chunk, so a
// stream that breaks or stalls before it still gets a proper error status; one
// that breaks or stalls after it is cut (the connection closes without the
// final chunk: the client sees an incomplete response, never a clean end).
func (s *server) writeStream(w http.ResponseWriter, r *http.Request, resp *response, body *streamBody,
	call *callContext, began time.Time) {
	defer body.stop()
	chunks := body.pump(call)
	headSent := false
	bodyless := r.Method == http.MethodHead || resp.status == http.StatusNoContent || resp.status == http.StatusNotModified
	flusher := http.NewResponseController(w)
	for {
		var c chunk
		var more bool
		select {
		case c, more = <-chunks:
		case <-call.Done():
			select {
			case c, more = <-chunks: // came at the same instant: prefer it
			default:
			}
		}
		if err := call.Err(); err != nil && c.data == nil && c.err == nil {
			if !errors.Is(err, context.DeadlineExceeded) {
				return // the client went away: nobody is left to answer
			}
			msg := "function timed out after " + s.cfg.TimeoutText + "s"
			log.Printf("sless: %s %s: stream idle: %s", r.Method, r.URL.Path, msg)
			if headSent {
				panic(http.ErrAbortHandler) // closes the connection without the final chunk
			}
			handlerHeaders(w.Header(), millis(began), callOutputOf(call))
			writeError(w, http.StatusGatewayTimeout, msg, kindTimeout)
			return
		}
		if c.err != nil {
			log.Printf("sless: %s %s: stream failed: %v", r.Method, r.URL.Path, c.err)
			if headSent {
				panic(http.ErrAbortHandler)
			}
			handlerHeaders(w.Header(), millis(began), callOutputOf(call))
			writeError(w, http.StatusInternalServerError, safeString(c.err.Error), fmt.Sprintf("%T", c.err))
			return
		}
		call.touch()
		if !headSent {
			header := w.Header()
			for name, values := range resp.header {
				header[name] = values
			}
			if header.Get("Content-Type") == "" {
				if body.text {
					header.Set("Content-Type", textPlain)
				} else {
					header.Set("Content-Type", "application/octet-stream")
				}
			}
			handlerHeaders(header, millis(began), callOutputOf(call)) // only lines before the head
			w.WriteHeader(resp.status)
			headSent = true
		}
		if !more || bodyless {
			return
		}
		if len(c.data) > 0 {
			if _, err := w.Write(c.data); err != nil {
				return // the client went away
			}
			if err := flusher.Flush(); err != nil {
				return
			}
		}
	}
}

func millis(began time.Time) string {
	return strconv.FormatFloat(float64(time.Since(began).Microseconds())/1000, 'f', 3, 64)
}

// collectStreams reads a streamed result to its end (the one-shot runner's
// result is one value): the stream becomes the text of its chunks, in a bare
// result as in a response description's "body". SLESS_TIMEOUT_SEC is the
// longest wait for each chunk, as in the server.
func collectStreams(call *callContext, result any, cfg Config) (any, *failure) {
	stream := asStream(result)
	bare := stream != nil
	desc, isDesc := result.(map[string]any)
	if !bare && isDesc {
		if _, ok := integerStatus(desc["statusCode"]); ok {
			stream = asStream(desc["body"])
		}
	}
	if stream == nil {
		return result, nil
	}
	defer stream.stop()
	var text []byte
	for c := range stream.pump(call) {
		if c.err != nil {
			return nil, &failure{status: 500, message: safeString(c.err.Error), kind: fmt.Sprintf("%T", c.err)}
		}
		call.touch()
		text = append(text, c.data...)
	}
	if err := call.Err(); err != nil {
		return nil, timedOut(cfg)
	}
	if bare {
		return string(text), nil
	}
	out := withoutBody(desc)
	out["body"] = string(text)
	return out, nil
}
