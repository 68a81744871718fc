package slessrt

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
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
