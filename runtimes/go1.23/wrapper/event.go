package slessrt

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"
)

// buildEvent turns a request into the handler's event: a JSON object body is the
// event itself, any other body lands in event["body"] (base64 when it is not
// UTF-8), and the request's metadata is added under the reserved "_" keys, which
// win over same-named keys of the body.
func buildEvent(r *http.Request, body []byte) map[string]any {
	event := bodyEvent(body)
	event["_method"] = strings.ToUpper(r.Method)
	event["_path"] = rawPath(r)
	event["_query"] = parseQuery(rawQuery(r))
	headers := lowerHeaders(r)
	// X-Sless-Params: the platform's (the matched http trigger's path parameters), so never in _headers
	if params, found := headers["x-sless-params"]; found {
		delete(headers, "x-sless-params")
		event["_params"] = pathParams(params.(string))
	} else {
		event["_params"] = map[string]any{}
	}
	event["_headers"] = headers
	accept, _ := headers["accept"].(string)
	event["_accept"] = accept
	return event
}

func bodyEvent(body []byte) map[string]any {
	if len(body) == 0 {
		return make(map[string]any, 6)
	}
	if !utf8.Valid(body) {
		return map[string]any{"body": base64.StdEncoding.EncodeToString(body), "isBase64Encoded": true}
	}
	if trimmed := bytes.TrimLeft(body, " \t\r\n"); len(trimmed) > 0 && trimmed[0] == '{' {
		var obj map[string]any
		if json.Unmarshal(body, &obj) == nil && obj != nil {
			return obj
		}
	}
	return map[string]any{"body": string(body)}
}

// pathParams is the X-Sless-Params header's object of strings (the matched http
// trigger's path parameters), as a map[string]any like _query; an empty map when
// it is anything else (not UTF-8, not JSON, not an object, a value not a string).
func pathParams(raw string) map[string]any {
	var params map[string]any
	if !utf8.ValidString(raw) || json.Unmarshal([]byte(raw), &params) != nil || params == nil {
		return map[string]any{}
	}
	for _, value := range params {
		if _, ok := value.(string); !ok {
			return map[string]any{}
		}
	}
	return params
}

// rawPath is the path as the client sent it (still percent-encoded), like the
// other runtimes report it; absolute-form request targets fall back to the URL.
func rawPath(r *http.Request) string {
	target := r.RequestURI
	if !strings.HasPrefix(target, "/") {
		return r.URL.EscapedPath()
	}
	if i := strings.IndexByte(target, '?'); i >= 0 {
		return target[:i]
	}
	return target
}

// rawQuery reads the query from the request line rather than r.URL, because the
// server is wrapped in http.AllowQuerySemicolons (which rewrites r.URL.RawQuery)
// only to silence net/http's per-request warning about ';' in queries.
func rawQuery(r *http.Request) string {
	if _, query, found := strings.Cut(r.RequestURI, "?"); found {
		return query
	}
	return r.URL.RawQuery
}

// parseQuery splits on '&' only and keeps the last value of a repeated key; a
// key without '=' gets "". Malformed escapes are kept verbatim instead of
// dropping the pair as url.ParseQuery would.
func parseQuery(raw string) map[string]any {
	query := make(map[string]any)
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		if pair == "" {
			continue
		}
		key, value, _ := strings.Cut(pair, "=")
		query[unescape(key)] = unescape(value)
	}
	return query
}

func unescape(s string) string {
	if !strings.ContainsAny(s, "%+") {
		return s
	}
	if u, err := url.QueryUnescape(s); err == nil {
		return strings.ToValidUTF8(u, "\uFFFD")
	}
	return strings.ReplaceAll(s, "+", " ")
}

// lowerHeaders restores what net/http moves out of r.Header (Host,
// Transfer-Encoding) so the handler sees every header the client sent.
func lowerHeaders(r *http.Request) map[string]any {
	headers := make(map[string]any, len(r.Header)+2)
	for name, values := range r.Header {
		headers[strings.ToLower(name)] = strings.Join(values, ", ")
	}
	if r.Host != "" {
		headers["host"] = r.Host
	}
	if len(r.TransferEncoding) > 0 {
		headers["transfer-encoding"] = strings.Join(r.TransferEncoding, ", ")
	}
	return headers
}
