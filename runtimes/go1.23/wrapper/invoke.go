package slessrt

import (
	"context"
	"errors"
	"fmt"
	"log"
	"runtime/debug"
	"sync"
	"sync/atomic"
)

// Handler is the signature of the user's entrypoint.
type Handler func(ctx context.Context, event map[string]any) (any, error)

// failure is an invocation that produced no result; kind becomes the "type"
// field of the JSON error body.
type failure struct {
	status  int
	message string
	kind    string
}

const (
	kindTimeout  = "Timeout"
	kindPanic    = "panic"
	kindCanceled = "Canceled"
)

type outcome struct {
	result   any
	err      error
	panicked bool
	panicMsg string
}

// invoke calls h in its own goroutine under cfg.Timeout. Go cannot stop a
// goroutine, so on timeout the handler keeps running with its ctx cancelled
// while the caller gets a Timeout failure at once. A panic in the handler's
// goroutine is recovered and logged with its stack; a panic in a goroutine the
// handler started itself still ends the process (Go offers no way around that).
//
// The handler's ctx (returned) is the caller's to stop once the answer is
// written: a streamed result keeps it alive, its deadline moving with every chunk.
func invoke(parent context.Context, h Handler, event map[string]any, cfg Config) (any, *callContext, *failure) {
	ctx := newCallContext(parent, cfg.Timeout)
	result, fail := wait(ctx, h, event, cfg)
	return result, ctx, fail
}

func wait(ctx *callContext, h Handler, event map[string]any, cfg Config) (any, *failure) {
	done := start(ctx, h, event)
	select {
	case o := <-done:
		return interpret(ctx, o, cfg)
	case <-ctx.Done():
		select {
		case o := <-done: // finished at the same instant: prefer the real outcome
			return interpret(ctx, o, cfg)
		default:
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			abandon(done, cfg)
			return nil, timedOut(cfg)
		}
		return nil, &failure{status: 499, message: "the client closed the request", kind: kindCanceled}
	}
}

// abandoned counts handlers still running after their timeout (their ctx is
// cancelled, but a handler that ignores it keeps its goroutine and its CPU).
// Past cfg.MaxAbandoned the server drains and exits with recycleExit, so its
// supervisor starts a fresh process: the only way to stop such goroutines.
var (
	abandoned   atomic.Int64
	recycle     = make(chan struct{})
	recycleOnce sync.Once
)

const recycleExit = 75 // EX_TEMPFAIL, as in the other runtimes

func abandon(done <-chan outcome, cfg Config) {
	if n := abandoned.Add(1); n >= int64(cfg.MaxAbandoned) {
		recycleOnce.Do(func() {
			log.Printf("sless: %d handlers still running after their timeouts: recycling the process", n)
			close(recycle)
		})
	}
	go func() {
		<-done
		abandoned.Add(-1)
	}()
}

// start runs the handler; the buffered channel lets an abandoned (timed-out)
// goroutine finish without leaking on the send.
func start(ctx context.Context, h Handler, event map[string]any) <-chan outcome {
	done := make(chan outcome, 1)
	go func() {
		out := callOutputOf(ctx)
		out.begin()
		var o outcome
		returned := false
		// In this order: a panic's stack is logged (it is the call's output), the
		// end marker is written, then the outcome is sent, so the server knows
		// whether the call wrote anything before it answers.
		defer func() {
			if !returned {
				p := recover()
				msg := "the handler called runtime.Goexit"
				if p != nil {
					msg = safeString(func() string { return fmt.Sprint(p) })
				}
				log.Printf("sless: handler panic: %s\n%s", msg, debug.Stack())
				o = outcome{panicked: true, panicMsg: msg}
			}
			out.end()
			done <- o
		}()
		result, err := h(ctx, event)
		returned = true
		o = outcome{result: result, err: err}
	}()
	return done
}

func interpret(ctx context.Context, o outcome, cfg Config) (any, *failure) {
	switch {
	case o.panicked:
		return nil, &failure{status: 500, message: o.panicMsg, kind: kindPanic}
	case o.err == nil:
		return o.result, nil
	case errors.Is(o.err, context.DeadlineExceeded) && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return nil, timedOut(cfg) // the handler gave up because of our deadline
	}
	msg := safeString(func() string { return o.err.Error() })
	return nil, &failure{status: 500, message: msg, kind: fmt.Sprintf("%T", o.err)}
}

func timedOut(cfg Config) *failure {
	return &failure{status: 504, message: "function timed out after " + cfg.TimeoutText + "s", kind: kindTimeout}
}

// safeString guards against Error/String methods that panic themselves, such as
// a typed nil pointer returned as a non-nil error.
func safeString(f func() string) (s string) {
	defer func() {
		if p := recover(); p != nil {
			s = fmt.Sprintf("(message unavailable: %v)", p)
		}
	}()
	return f()
}
