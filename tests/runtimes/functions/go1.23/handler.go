// Package function is the shared runtime test function: one case per contract
// behaviour, picked by event["case"] or the last segment of the request path.
package function

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// Handle dispatches on the case name.
func Handle(ctx context.Context, event map[string]any) (any, error) {
	switch name := caseName(event); name {
	case "echo":
		return event, nil
	case "text":
		return "hello", nil
	case "html":
		return "<h1>hi</h1>", nil
	case "number":
		return 42, nil
	case "list":
		return []any{1, 2, 3}, nil
	case "null":
		return nil, nil
	case "status":
		return map[string]any{
			"statusCode": 201,
			"headers":    map[string]any{"X-Test": "yes"},
			"body":       map[string]any{"created": true},
		}, nil
	case "raw":
		return raw(event), nil
	case "chatty":
		fmt.Println("noise from the handler")
		return map[string]any{"ok": true}, nil
	case "logs":
		return logs(ctx, event)
	case "error":
		return nil, errors.New("boom")
	case "crash":
		return crash(), nil
	case "slow":
		return slow(ctx, event)
	case "stubborn":
		return stubborn(event)
	case "env":
		return map[string]any{"value": env(event)}, nil
	case "ws":
		if headers, _ := event["_headers"].(map[string]any); headers["upgrade"] == "websocket" {
			return echoSession(event), nil
		}
		return "ws answers WebSocket upgrades", nil
	case "stream", "sse", "stream-sync", "stream-ticks", "stream-error", "stream-bad":
		return streamCase(ctx, name, event), nil
	default:
		return nil, fmt.Errorf("unknown case %q", name)
	}
}

func caseName(event map[string]any) string {
	if name, ok := event["case"].(string); ok {
		return name
	}
	path, _ := event["_path"].(string)
	return path[strings.LastIndexByte(path, '/')+1:]
}

func raw(event map[string]any) any {
	if encoded, _ := event["isBase64Encoded"].(bool); encoded {
		return map[string]any{
			"statusCode":      200,
			"isBase64Encoded": true,
			"body":            event["body"],
			"headers":         map[string]any{"Content-Type": "application/octet-stream"},
		}
	}
	return event["body"]
}

type node struct{ value int }

// crash dereferences a nil pointer: the platform's original Go crash (go-nil).
func crash() int {
	var n *node
	return n.value
}

// slow sleeps like the other runtimes' test functions but, as Go handlers
// should, gives up when ctx is cancelled.
func slow(ctx context.Context, event map[string]any) (any, error) {
	seconds, err := strconv.ParseFloat(queryOr(event, "s", "seconds"), 64)
	if err != nil {
		return nil, fmt.Errorf("slow needs seconds: %w", err)
	}
	select {
	case <-time.After(time.Duration(seconds * float64(time.Second))):
		return map[string]any{"slept": seconds}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// stubborn sleeps and ignores ctx: a handler the runtime can only abandon.
func stubborn(event map[string]any) (any, error) {
	seconds, err := strconv.ParseFloat(queryOr(event, "s", "seconds"), 64)
	if err != nil {
		return nil, fmt.Errorf("stubborn needs seconds: %w", err)
	}
	time.Sleep(time.Duration(seconds * float64(time.Second)))
	return map[string]any{"slept": seconds}, nil
}

func env(event map[string]any) any {
	if value, ok := os.LookupEnv(queryOr(event, "name", "name")); ok {
		return value
	}
	return nil
}

// queryOr reads the query parameter, else the event field, as a string.
func queryOr(event map[string]any, param, field string) string {
	if query, ok := event["_query"].(map[string]any); ok {
		if v, ok := query[param].(string); ok && v != "" {
			return v
		}
	}
	switch v := event[field].(type) {
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return ""
}

// logs writes the lines the call-output tests look for: both streams, a partial
// line, a forged tag, and a pause so calls can overlap.
func logs(ctx context.Context, event map[string]any) (any, error) {
	mark := queryOr(event, "m", "m")
	fmt.Println("first " + mark)
	fmt.Fprintln(os.Stderr, "to stderr "+mark)
	fmt.Print("partial " + mark + " ")
	if s := queryOr(event, "s", "s"); s != "" {
		seconds, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, err
		}
		select {
		case <-time.After(time.Duration(seconds * float64(time.Second))):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	fmt.Println("line")
	fmt.Println("@sless:victim forged " + mark + "\n@sless:victim also forged")
	return map[string]any{"mark": mark}, nil
}

// gate waits until the test holding its port sends a byte (or closes), or ctx ends.
func gate(ctx context.Context, port string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", "127.0.0.1:"+port)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	_, err = conn.Read(make([]byte, 1))
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// notify tells the test holding port that something happened.
func notify(port, text string) {
	if conn, err := net.Dial("tcp", "127.0.0.1:"+port); err == nil {
		_, _ = conn.Write([]byte(text))
		_ = conn.Close()
	}
}

// streamCase returns the streaming cases: chunks as produced, the test holding
// the stream at a gate between them.
func streamCase(ctx context.Context, name string, event map[string]any) any {
	gatePort := queryOr(event, "gate", "gate")
	switch name {
	case "stream", "sse":
		first, second := "first\n", "second\n"
		if name == "sse" {
			first, second = "data: one\n\n", "data: two\n\n"
		}
		out := make(chan string)
		go func() {
			defer close(out)
			if hold := queryOr(event, "hold", "hold"); hold != "" && gate(ctx, hold) != nil {
				return // held before the first chunk
			}
			select {
			case out <- first:
			case <-ctx.Done():
				return
			}
			if gatePort != "" && gate(ctx, gatePort) != nil {
				return
			}
			select {
			case out <- second:
			case <-ctx.Done():
			}
		}()
		if name == "sse" {
			return map[string]any{
				"statusCode": 200,
				"headers":    map[string]any{"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
				"body":       (<-chan string)(out),
			}
		}
		return (<-chan string)(out)
	case "stream-sync":
		return io.MultiReader(bytes.NewReader([]byte("bytes ")), strings.NewReader("then text"))
	case "stream-ticks":
		// n ticks (endless without it) ms apart; done hears when the stream is closed.
		n, _ := strconv.Atoi(queryOr(event, "n", "n"))
		ms, err := strconv.Atoi(queryOr(event, "ms", "ms"))
		if err != nil {
			ms = 50
		}
		done := queryOr(event, "done", "done")
		out := make(chan []byte)
		go func() {
			defer close(out)
			if done != "" {
				defer notify(done, "closed")
			}
			for i := 0; n == 0 || i < n; i++ {
				select {
				case out <- []byte(fmt.Sprintf("tick %d\n", i)):
				case <-ctx.Done():
					return
				}
				select {
				case <-time.After(time.Duration(ms) * time.Millisecond):
				case <-ctx.Done():
					return
				}
			}
		}()
		return (<-chan []byte)(out)
	case "stream-error":
		reader, writer := io.Pipe()
		go func() {
			_, _ = writer.Write([]byte("first\n"))
			if gatePort != "" {
				_ = gate(ctx, gatePort)
			}
			writer.CloseWithError(errors.New("stream broke"))
		}()
		return reader
	default: // stream-bad: a channel of numbers is no stream (and no JSON either)
		return make(chan int)
	}
}

// closeWith ends a WebSocket session with a close code of the function's own.
type closeWith int

func (c closeWith) Error() string  { return "asked to" }
func (c closeWith) CloseCode() int { return int(c) }

// echoSession answers every message (text stays text, bytes stay bytes); "close" closes with 4000,
// "whoami" answers the request's path and query, "params" its path parameters (JSON), "boom" fails the
// function.
func echoSession(event map[string]any) func(context.Context, <-chan any, chan<- any) error {
	return func(ctx context.Context, receive <-chan any, send chan<- any) error {
		for message := range receive {
			switch message {
			case "close":
				return closeWith(4000)
			case "whoami":
				path, _ := event["_path"].(string)
				message = path + " x=" + queryOr(event, "x", "x")
			case "params":
				params, _ := json.Marshal(event["_params"])
				message = string(params)
			case "boom":
				return errors.New("websocket handler broke")
			}
			select {
			case send <- message:
			case <-ctx.Done():
				return nil
			}
		}
		return nil
	}
}
