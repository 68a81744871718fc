// A reverse proxy peer for bench.proxies: Go's httputil.ReverseProxy (the core of Fission's router and of
// OpenFaaS's gateway) in front of one upstream, with a Transport tuned for keep-alive to it.
// Usage: go build -o go_proxy go_proxy.go && ./go_proxy PORT UPSTREAM_URL   (listens on 127.0.0.1).
package main

import (
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"time"
)

func main() {
	if len(os.Args) != 3 {
		log.Fatal("usage: go_proxy PORT UPSTREAM_URL")
	}
	upstream, err := url.Parse(os.Args[2])
	if err != nil {
		log.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(upstream)
	// The default Transport keeps 2 idle connections per host: at 32 client connections most calls would open a
	// new upstream connection. Tuned as a gateway is: keep-alive, enough idle connections for every caller.
	proxy.Transport = &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
		ResponseHeaderTimeout: 30 * time.Second,
	}
	server := &http.Server{Addr: "127.0.0.1:" + os.Args[1], Handler: proxy, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(server.ListenAndServe())
}
