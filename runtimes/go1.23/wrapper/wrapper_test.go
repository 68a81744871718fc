package slessrt

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseQueryKeepsLastValueAndOddPairs(t *testing.T) {
	got := parseQuery("a=1&a=2&flag&&c=%41+x;d=1&bad=%zz+y")
	want := map[string]any{"a": "2", "flag": "", "c": "A x;d=1", "bad": "%zz y"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %q, want %q", k, got[k], v)
		}
	}
}

func TestIntegerStatus(t *testing.T) {
	for _, v := range []any{201, int64(201), uint8(201), 201.0, float32(201)} {
		if code, ok := integerStatus(v); !ok || code != 201 {
			t.Errorf("%T %v: got %d %v", v, v, code, ok)
		}
	}
	for _, v := range []any{"201", true, 201.5, nil} {
		if _, ok := integerStatus(v); ok {
			t.Errorf("%T %v accepted as a status", v, v)
		}
	}
}

type described struct {
	StatusCode int               `json:"statusCode"`
	Headers    map[string]string `json:"headers"`
	Body       string            `json:"body"`
}

func TestRenderResultShapes(t *testing.T) {
	cases := []struct {
		in     any
		status int
		ctype  string
		body   string
	}{
		{"hi", 200, textPlain, "hi"},
		{" \n<p>", 200, textHTML, " \n<p>"},
		{map[string]any{"a": "<&>"}, 200, appJSON, `{"a":"<&>"}`},
		{[]int{1}, 200, appJSON, "[1]"},
		{nil, 200, appJSON, "null"},
		{map[string]any{"statusCode": "201"}, 200, appJSON, `{"statusCode":"201"}`},
		{described{202, map[string]string{"Content-Type": "text/csv"}, "a,b"}, 202, "text/csv", "a,b"},
		{map[string]any{"statusCode": 200, "isBase64Encoded": true, "body": "AAE="}, 200, textPlain, "\x00\x01"},
		{map[string]any{"statusCode": 204}, 204, "", ""},
	}
	for _, c := range cases {
		resp, err := renderValue(c.in)
		if err != nil {
			t.Errorf("%#v: %v", c.in, err)
			continue
		}
		if resp.status != c.status || resp.header.Get("Content-Type") != c.ctype || string(resp.body) != c.body {
			t.Errorf("%#v: got %d %q %q", c.in, resp.status, resp.header.Get("Content-Type"), resp.body)
		}
	}
	if _, err := renderValue(map[string]any{"statusCode": 42}); err == nil {
		t.Error("statusCode 42 accepted")
	}
	if _, err := renderValue(make(chan int)); err == nil {
		t.Error("a channel was encoded")
	}
}

func TestInvokeOutcomes(t *testing.T) {
	cfg := Config{Timeout: 50 * time.Millisecond, TimeoutText: "0.05"}
	cancelled := make(chan struct{})
	cases := []struct {
		name    string
		handler Handler
		kind    string
	}{
		{"error", func(context.Context, map[string]any) (any, error) { return nil, errors.New("x") }, "*errors.errorString"},
		{"panic", func(context.Context, map[string]any) (any, error) { panic("x") }, kindPanic},
		{"timeout", func(ctx context.Context, _ map[string]any) (any, error) {
			<-ctx.Done()
			close(cancelled)
			time.Sleep(time.Second) // still running after the caller got its answer
			return nil, nil
		}, kindTimeout},
	}
	for _, c := range cases {
		_, call, fail := invoke(context.Background(), c.handler, nil, cfg)
		call.stop(context.Canceled)
		if fail == nil || fail.kind != c.kind {
			t.Errorf("%s: got %+v, want kind %s", c.name, fail, c.kind)
		}
	}
	select {
	case <-cancelled:
	case <-time.After(time.Second):
		t.Error("the timed-out handler's ctx was not cancelled")
	}
}

func TestEventFromRequest(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/a%2Fb/c?x=1&x=2", strings.NewReader(`{"_path":"no","k":1}`))
	r.Header.Add("X-Two", "1")
	r.Header.Add("X-Two", "2")
	ev := buildEvent(r, []byte(`{"_path":"no","k":1}`))
	if ev["_path"] != "/a%2Fb/c" || ev["k"] != 1.0 || ev["_method"] != "POST" {
		t.Fatalf("event %v", ev)
	}
	if h := ev["_headers"].(map[string]any); h["x-two"] != "1, 2" || h["host"] != "example.com" {
		t.Errorf("headers %v", h)
	}
	if q := ev["_query"].(map[string]any); q["x"] != "2" {
		t.Errorf("query %v", q)
	}
	if ev := buildEvent(r, []byte{0xff}); ev["isBase64Encoded"] != true || ev["body"] != "/w==" {
		t.Errorf("binary body %v", ev)
	}
	if p := ev["_params"].(map[string]any); len(p) != 0 {
		t.Errorf("params without the header %v", p)
	}
}

func TestPathParams(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "/users/42", nil)
	r.Header.Set("X-Sless-Params", `{"id":"42","name":"caf\u00e9","raw":"ü"}`)
	ev := buildEvent(r, nil)
	if p := ev["_params"].(map[string]any); len(p) != 3 || p["id"] != "42" || p["name"] != "café" || p["raw"] != "ü" {
		t.Errorf("params %v", p)
	}
	if _, found := ev["_headers"].(map[string]any)["x-sless-params"]; found {
		t.Errorf("X-Sless-Params in _headers")
	}
	for _, raw := range []string{"not json", "[1]", `{"a":1}`, `{"a":null}`, "null", `"x"`, "{\"a\":\"\xff\"}", ""} {
		if p := pathParams(raw); p == nil || len(p) != 0 {
			t.Errorf("pathParams(%q) = %v, want {}", raw, p)
		}
	}
}

func TestProtocolErrorsBecomeJSON(t *testing.T) {
	got, ok := rewriteProtocolError([]byte("HTTP/1.1 400 Bad Request: bad Content-Length" + netHTTPErrorHeaders +
		"400 Bad Request: bad Content-Length"))
	want := "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 63\r\nConnection: close\r\n\r\n" +
		`{"error":"Bad Request: bad Content-Length","type":"BadRequest"}`
	if !ok || string(got) != want {
		t.Errorf("got %v %q", ok, got)
	}
	// What a handler writes through net/http never matches: sorted headers, always a Date.
	rec := "HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n" +
		"Date: Mon, 02 Jan 2006 15:04:05 GMT\r\n\r\nno"
	if _, ok := rewriteProtocolError([]byte(rec)); ok {
		t.Error("a handler's response was rewritten")
	}
}

func TestInvalidResponseHeadersAreRefused(t *testing.T) {
	for _, headers := range []map[string]any{{"Bad Name": "x"}, {"X-Ok": "a\r\nInjected: 1"}, {"": "x"}} {
		if _, err := renderValue(map[string]any{"statusCode": 200, "headers": headers}); err == nil {
			t.Errorf("%v accepted", headers)
		}
	}
	resp, err := renderValue(map[string]any{"statusCode": 200, "headers": map[string]any{
		"set-cookie": []any{"a=1", "b=2"}, "X-Num": 3.0, "Connection": "keep-alive", "Content-Length": "99"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.header.Values("Set-Cookie")) != 2 || resp.header.Get("X-Num") != "3" ||
		resp.header.Get("Connection") != "" || resp.header.Get("Content-Length") != "" {
		t.Errorf("headers %v", resp.header)
	}
}

// syncBuffer collects what a reader forwards; the test reads it meanwhile.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// withTagging puts a tagger's pipes in place of os.Stdout, os.Stderr and the
// log package's output, as serve does, until the test ends.
func withTagging(tb testing.TB) (stdout, stderr *syncBuffer) {
	stdout, stderr = &syncBuffer{}, &syncBuffer{}
	tags, err := newTagger()
	if err != nil {
		tb.Fatal(err)
	}
	tags.start(stdout, stderr)
	realOut, realErr := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = tags.pipes[0].w, tags.pipes[1].w
	log.SetOutput(os.Stderr)
	outputTags = tags
	wait, grace := outputWait, outputGrace
	outputWait, outputGrace = 10*time.Second, 0 // a loaded test machine: what is kept, not how fast
	tb.Cleanup(func() {
		outputWait, outputGrace = wait, grace
		outputTags = nil
		os.Stdout, os.Stderr = realOut, realErr
		log.SetOutput(os.Stderr)
		tags.close()
	})
	return stdout, stderr
}

func handlerServer(h Handler) *server {
	return &server{cfg: Config{Timeout: 10 * time.Second, TimeoutText: "10", MaxBodyBytes: 1 << 20}, handler: h}
}

func serveCall(s *server, id string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "/call", nil)
	r.Header.Set("X-Request-Id", id)
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	return w
}

// outputOf decodes an answer's X-Sless-Output; nil when it has none.
func outputOf(t *testing.T, w *httptest.ResponseRecorder) *outputBody {
	t.Helper()
	value := w.Header().Get(OutputHeader)
	if value == "" {
		return nil
	}
	data, err := base64.StdEncoding.DecodeString(value)
	if err != nil {
		t.Fatalf("%s is not base64: %v", OutputHeader, err)
	}
	var body outputBody
	if err := json.Unmarshal(data, &body); err != nil || body.Lines == nil {
		t.Fatalf("%s is not the contract's JSON: %s", OutputHeader, data)
	}
	return &body
}

func texts(body *outputBody, stream string) []string {
	var out []string
	for _, line := range body.Lines {
		if stream == "" || line.Stream == stream {
			out = append(out, line.Text)
		}
	}
	return out
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

func TestOutputHeaderCarriesTheCallsLines(t *testing.T) {
	stdout, _ := withTagging(t)
	s := handlerServer(func(context.Context, map[string]any) (any, error) {
		fmt.Println("one")
		fmt.Fprintln(os.Stderr, "two")
		log.Print("three")
		fmt.Println("@sless:other forged")
		fmt.Print("last, without its newline")
		return map[string]any{"statusCode": 200, "headers": map[string]any{OutputHeader: "forged"}, "body": "ok"}, nil
	})
	before := float64(time.Now().UnixMilli()) / 1e3
	w := serveCall(s, "out-1")
	after := float64(time.Now().UnixMilli()) / 1e3
	body := outputOf(t, w)
	if w.Code != 200 || body == nil {
		t.Fatalf("%d %v", w.Code, w.Header())
	}
	if got := texts(body, "stdout"); !slices.Equal(got, []string{"one", "@sless:other forged", "last, without its newline"}) {
		t.Errorf("stdout lines %q", got)
	}
	if got := texts(body, "stderr"); len(got) != 2 || got[0] != "two" || !strings.HasSuffix(got[1], " three") {
		t.Errorf("stderr lines %q", got)
	}
	for i, line := range body.Lines {
		if line.TS < before || line.TS > after || (i > 0 && line.TS < body.Lines[i-1].TS) {
			t.Errorf("ts %v of %q not in order within [%v, %v]", line.TS, line.Text, before, after)
		}
	}
	if body.Truncated {
		t.Error("truncated")
	}
	// Still written, tagged, to the process's output.
	waitFor(t, "the tagged lines", func() bool { return strings.Contains(stdout.String(), "@sless:out-1 last, without") })
	if !strings.HasPrefix(stdout.String(), "@sless:out-1 one\n@sless:out-1 @sless:other forged\n") {
		t.Errorf("stdout %q", stdout.String())
	}
}

func TestSilentCallHasNoOutputHeader(t *testing.T) {
	withTagging(t)
	s := handlerServer(func(context.Context, map[string]any) (any, error) {
		return map[string]any{"statusCode": 200, "headers": map[string]any{OutputHeader: "forged"}, "body": "ok"}, nil
	})
	for i := range 20 {
		if w := serveCall(s, fmt.Sprintf("quiet-%d", i)); w.Code != 200 || w.Header().Values(OutputHeader) != nil {
			t.Fatalf("%d %v", w.Code, w.Header())
		}
	}
}

func TestQuietPipesNeedNoReader(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("queued bytes are only counted on Linux")
	}
	tags, err := newTagger() // no readers: nothing is ever taken out, so the counts hold still
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		tags.close()
		for _, p := range tags.pipes {
			_ = p.r.Close()
		}
	}()
	silent := tags.newCall("silent")
	silent.begin()
	silent.end()
	if state := silent.state.Load(); state != callSettled {
		t.Errorf("a silent call's state is %d", state)
	}
	wrote := tags.newCall("wrote")
	wrote.begin()
	_, _ = tags.pipes[1].w.Write([]byte("x\n"))
	wrote.end()
	if state := wrote.state.Load(); state != callWrote {
		t.Errorf("a writing call's state is %d", state)
	}
}

func TestOutputIsTruncated(t *testing.T) {
	c := &callOutput{}
	c.add("stdout", bytes.Repeat([]byte("a"), maxOutputText-4))
	c.add("stderr", []byte("\xffb")) // an invalid byte is sent, and counted, as U+FFFD
	c.add("stdout", []byte("c"))     // one byte over
	c.add("stdout", nil)             // fits, but comes after a line that did not
	var body outputBody
	data, _ := base64.StdEncoding.DecodeString(c.header())
	if err := json.Unmarshal(data, &body); err != nil {
		t.Fatal(err)
	}
	if len(body.Lines) != 2 || body.Lines[1].Text != "\uFFFDb" || !body.Truncated {
		t.Errorf("lines %d, second %q, truncated %v", len(body.Lines), body.Lines[1].Text, body.Truncated)
	}
	c = &callOutput{}
	for range maxOutputLines + 1 {
		c.add("stdout", nil)
	}
	if lines, truncated := c.seal(); len(lines) != maxOutputLines || !truncated {
		t.Errorf("%d empty lines kept, truncated %v", len(lines), truncated)
	}
}

func TestFailingHandlersAnswerWithTheirLines(t *testing.T) {
	withTagging(t)
	s := handlerServer(func(_ context.Context, event map[string]any) (any, error) {
		fmt.Println("about to fail")
		if event["_path"] == "/panic" {
			panic("boom")
		}
		return nil, errors.New("failed")
	})
	w := serveCall(s, "fail-1")
	if body := outputOf(t, w); w.Code != 500 || body == nil || !slices.Equal(texts(body, ""), []string{"about to fail"}) {
		t.Errorf("error answer %d %v", w.Code, body)
	}
	r := httptest.NewRequest(http.MethodGet, "/panic", nil)
	r.Header.Set("X-Request-Id", "panic-1")
	w = httptest.NewRecorder()
	s.ServeHTTP(w, r)
	body := outputOf(t, w)
	if w.Code != 500 || body == nil || !slices.Equal(texts(body, "stdout"), []string{"about to fail"}) ||
		len(texts(body, "stderr")) < 2 || !strings.HasSuffix(texts(body, "stderr")[0], "sless: handler panic: boom") {
		t.Errorf("panic answer %d %v", w.Code, body)
	}
}

func TestOverlappingCallsKeepOnlyWhatEachWroteAlone(t *testing.T) {
	withTagging(t)
	aAlone, bWrote, aWrote := make(chan struct{}), make(chan struct{}), make(chan struct{})
	s := handlerServer(func(_ context.Context, event map[string]any) (any, error) {
		if event["_path"] == "/a" {
			fmt.Println("a alone")
			close(aAlone)
			<-bWrote
			fmt.Println("a while b runs")
			close(aWrote)
			return "a", nil
		}
		fmt.Println("b while a runs")
		close(bWrote)
		<-aWrote
		return "b", nil
	})
	answers := make(chan *httptest.ResponseRecorder)
	go func() {
		r := httptest.NewRequest(http.MethodGet, "/a", nil)
		r.Header.Set("X-Request-Id", "a")
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		answers <- w
	}()
	<-aAlone
	b := serveCall(s, "b")
	a := <-answers
	if body := outputOf(t, a); body == nil || !slices.Equal(texts(body, ""), []string{"a alone"}) {
		t.Errorf("a's output %v", body)
	}
	if body := outputOf(t, b); body != nil {
		t.Errorf("b's output %v: its lines were written while a ran", body)
	}
}

func TestStreamedAnswerCarriesTheLinesBeforeItsHead(t *testing.T) {
	withTagging(t)
	s := handlerServer(func(context.Context, map[string]any) (any, error) {
		fmt.Println("before the stream")
		chunks := make(chan string)
		go func() {
			defer close(chunks)
			chunks <- "chunk"                // taken by the server once the handler has returned
			fmt.Println("from the producer") // so after the call's end marker: no call's
			chunks <- "s"
		}()
		return (<-chan string)(chunks), nil
	})
	w := serveCall(s, "stream-1")
	if body := outputOf(t, w); w.Body.String() != "chunks" || body == nil ||
		!slices.Equal(texts(body, ""), []string{"before the stream"}) {
		t.Errorf("%q %v", w.Body.String(), body)
	}
}

func TestTimedOutCallAnswersWithItsLinesSoFar(t *testing.T) {
	withTagging(t)
	s := handlerServer(func(ctx context.Context, _ map[string]any) (any, error) {
		fmt.Println("still working")
		out := callOutputOf(ctx)
		for { // until the reader kept the line: the timeout's answer does not wait for it
			out.mu.Lock()
			kept := len(out.lines)
			out.mu.Unlock()
			if kept > 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	s.cfg.Timeout, s.cfg.TimeoutText = 200*time.Millisecond, "0.2"
	w := serveCall(s, "slow-1")
	if body := outputOf(t, w); w.Code != 504 || body == nil || !slices.Equal(texts(body, ""), []string{"still working"}) {
		t.Errorf("%d %v", w.Code, body)
	}
}

// BenchmarkSilentCall is the cost of a call that writes nothing, which the
// output header must not raise (compare with X-Request-Id unset: no markers).
func BenchmarkSilentCall(b *testing.B) {
	withTagging(b)
	s := handlerServer(func(context.Context, map[string]any) (any, error) { return "ok", nil })
	r := httptest.NewRequest(http.MethodGet, "/call", nil)
	r.Header.Set("X-Request-Id", "bench-1")
	b.ResetTimer()
	for range b.N {
		s.ServeHTTP(httptest.NewRecorder(), r)
	}
}

func TestAMarkerAfterARunawayLineIsNotSplit(t *testing.T) {
	stdout, _ := withTagging(t)
	s := handlerServer(func(_ context.Context, event map[string]any) (any, error) {
		if event["_path"] == "/runaway" {
			// No newline: the end marker follows the text, and the reader's
			// buffer fills a few bytes into the marker.
			fmt.Print(strings.Repeat("x", maxLine-10))
			return "runaway", nil
		}
		fmt.Println("next")
		return "next", nil
	})
	r := httptest.NewRequest(http.MethodGet, "/runaway", nil)
	r.Header.Set("X-Request-Id", "runaway-1")
	s.ServeHTTP(httptest.NewRecorder(), r)
	w := serveCall(s, "next-1") // runs alone: the runaway call ended
	if body := outputOf(t, w); body == nil || !slices.Equal(texts(body, ""), []string{"next"}) {
		t.Errorf("the next call's output %v", body)
	}
	waitFor(t, "the next call's line", func() bool { return strings.Contains(stdout.String(), "@sless:next-1 next\n") })
	if strings.Contains(stdout.String(), "sless-") {
		t.Error("a marker was forwarded as text")
	}
}
