package slessrt

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
)

const (
	textPlain = "text/plain; charset=utf-8"
	textHTML  = "text/html; charset=utf-8"
	appJSON   = "application/json"
)

// response is a fully rendered HTTP answer.
type response struct {
	status int
	header http.Header
	body   []byte
}

// invalidResponse is a result the runtime cannot turn into HTTP; it becomes a 500.
type invalidResponse struct{ msg string }

func (e *invalidResponse) Error() string { return e.msg }

// renderResult maps a handler's return value to HTTP: strings are text (HTML
// when they start with '<'), an object with an integer "statusCode" describes
// the response itself, anything else is JSON. Values that are neither strings
// nor map[string]any are judged by their JSON form, so structs and typed strings
// behave like the objects and strings they encode to.
//
// A streamed result (see stream.go) comes back as its head (status and headers)
// and the stream; its body is sent as it is produced.
func renderResult(v any) (*response, *streamBody, error) {
	if stream := asStream(v); stream != nil {
		return &response{status: http.StatusOK, header: http.Header{}}, stream, nil
	}
	if x, ok := v.(map[string]any); ok {
		if code, ok := integerStatus(x["statusCode"]); ok {
			if stream := asStream(x["body"]); stream != nil {
				resp, err := describedResponse(code, withoutBody(x))
				return resp, stream, err
			}
		}
	}
	resp, err := renderValue(v)
	return resp, nil, err
}

// withoutBody is a response description minus its body (a stream, sent apart).
func withoutBody(desc map[string]any) map[string]any {
	head := make(map[string]any, len(desc))
	for k, v := range desc {
		if k != "body" {
			head[k] = v
		}
	}
	return head
}

func renderValue(v any) (*response, error) {
	switch x := v.(type) {
	case string:
		return textResponse(x), nil
	case map[string]any:
		if code, ok := integerStatus(x["statusCode"]); ok {
			return describedResponse(code, x)
		}
	case nil:
		return &response{status: http.StatusOK, header: contentType(appJSON), body: []byte("null")}, nil
	}
	data, err := marshalJSON(v)
	if err != nil {
		return nil, &invalidResponse{"cannot encode the result as JSON: " + err.Error()}
	}
	switch data[0] {
	case '"':
		var s string
		if json.Unmarshal(data, &s) == nil {
			return textResponse(s), nil
		}
	case '{':
		if _, isMap := v.(map[string]any); !isMap && bytes.Contains(data, []byte(`"statusCode"`)) {
			var obj map[string]any
			dec := json.NewDecoder(bytes.NewReader(data))
			dec.UseNumber()
			if dec.Decode(&obj) == nil {
				if code, ok := integerStatus(obj["statusCode"]); ok {
					return describedResponse(code, obj)
				}
			}
		}
	}
	return &response{status: http.StatusOK, header: contentType(appJSON), body: data}, nil
}

func textResponse(s string) *response {
	ct := textPlain
	if strings.HasPrefix(strings.TrimLeft(s, " \t\r\n\f\v"), "<") {
		ct = textHTML
	}
	return &response{status: http.StatusOK, header: contentType(ct), body: []byte(s)}
}

func contentType(ct string) http.Header {
	return http.Header{"Content-Type": []string{ct}}
}

// marshalJSON encodes without HTML escaping and without the encoder's newline.
func marshalJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// integerStatus accepts Go integers and integral floats (what JSON numbers
// decode to), never bools or strings.
func integerStatus(v any) (int, bool) {
	switch n := v.(type) {
	case int:
		return n, true
	case int8:
		return int(n), true
	case int16:
		return int(n), true
	case int32:
		return int(n), true
	case int64:
		return clampInt(n), true
	case uint:
		return clampInt(int64(min(uint64(n), math.MaxInt64))), true
	case uint8:
		return int(n), true
	case uint16:
		return int(n), true
	case uint32:
		return clampInt(int64(n)), true
	case uint64:
		return clampInt(int64(min(n, math.MaxInt64))), true
	case float64:
		return integralFloat(n)
	case float32:
		return integralFloat(float64(n))
	case json.Number:
		if i, err := n.Int64(); err == nil {
			return clampInt(i), true
		}
	}
	return 0, false
}

func integralFloat(f float64) (int, bool) {
	if f != math.Trunc(f) || math.IsInf(f, 0) || math.Abs(f) > 1e9 {
		return 0, false
	}
	return int(f), true
}

func clampInt(i int64) int {
	return int(max(min(i, 1<<31-1), -(1 << 31)))
}

// describedResponse renders {"statusCode", "headers", "body", "isBase64Encoded"}.
func describedResponse(code int, desc map[string]any) (*response, error) {
	if code < 200 || code > 599 {
		return nil, &invalidResponse{fmt.Sprintf("statusCode %d is not a final HTTP status (200-599)", code)}
	}
	header, err := responseHeaders(desc["headers"])
	if err != nil {
		return nil, err
	}
	resp := &response{status: code, header: header}
	var defaultType string
	switch body := desc["body"].(type) {
	case nil:
	case string:
		defaultType = textPlain
		resp.body = []byte(body)
		if isBase64, _ := desc["isBase64Encoded"].(bool); isBase64 {
			if resp.body, err = decodeBase64(body); err != nil {
				return nil, &invalidResponse{"body is not valid base64: " + err.Error()}
			}
		}
	case []byte:
		defaultType = "application/octet-stream"
		resp.body = body
	default:
		defaultType = appJSON
		if resp.body, err = marshalJSON(body); err != nil {
			return nil, &invalidResponse{"cannot encode the body as JSON: " + err.Error()}
		}
	}
	if defaultType != "" && header.Get("Content-Type") == "" {
		header.Set("Content-Type", defaultType)
	}
	return resp, nil
}

func decodeBase64(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	if b, err := base64.StdEncoding.DecodeString(s); err == nil {
		return b, nil
	}
	return base64.RawStdEncoding.DecodeString(strings.TrimRight(s, "="))
}

// responseHeaders accepts the shapes a Go handler naturally builds (map[string]any,
// map[string]string, http.Header) and anything whose JSON form is an object.
// Framing headers are dropped: the runtime computes the length itself.
func responseHeaders(v any) (http.Header, error) {
	header := http.Header{}
	var fields map[string]any
	switch h := v.(type) {
	case nil:
		return header, nil
	case map[string]any:
		fields = h
	case map[string]string:
		for name, value := range h {
			header.Add(name, value)
		}
	case http.Header:
		for name, values := range h {
			for _, value := range values {
				header.Add(name, value)
			}
		}
	default:
		data, err := json.Marshal(v)
		if err == nil {
			err = json.Unmarshal(data, &fields)
		}
		if err != nil || fields == nil {
			return nil, &invalidResponse{fmt.Sprintf("headers must be an object of strings, got %T", v)}
		}
	}
	for name, value := range fields {
		addHeaderValue(header, name, value)
	}
	for name, values := range header {
		if !validHeaderName(name) {
			return nil, &invalidResponse{fmt.Sprintf("invalid response header name %q", name)}
		}
		for _, value := range values {
			if strings.ContainsAny(value, "\r\n\x00") {
				return nil, &invalidResponse{fmt.Sprintf("invalid value of response header %s", name)}
			}
		}
	}
	for _, name := range []string{"Content-Length", "Transfer-Encoding", "Connection"} {
		header.Del(name) // the server's own framing
	}
	return header, nil
}

// validHeaderName is RFC 9110's token: net/http would silently drop anything else.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c >= 0x80 || c <= ' ' || strings.IndexByte("\"(),/:;<=>?@[\\]{}\x7f", c) >= 0 {
			return false
		}
	}
	return true
}

func addHeaderValue(header http.Header, name string, value any) {
	switch x := value.(type) {
	case nil:
	case string:
		header.Add(name, x)
	case []string:
		for _, s := range x {
			header.Add(name, s)
		}
	case []any:
		for _, item := range x {
			addHeaderValue(header, name, item)
		}
	case float64:
		header.Add(name, strconv.FormatFloat(x, 'f', -1, 64))
	default:
		header.Add(name, fmt.Sprint(x))
	}
}
