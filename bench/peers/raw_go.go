// Ceiling for the go1.23 runtime: a bare net/http server answering a fixed short text.
// Usage: go build -o raw_go raw_go.go && ./raw_go PORT   (listens on 127.0.0.1).
package main

import (
	"io"
	"log"
	"net/http"
	"os"
)

var body = []byte("ok")

func main() {
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Content-Length", "2")
		_, _ = w.Write(body)
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:"+os.Args[1], nil))
}
