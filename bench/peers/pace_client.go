// Paced keep-alive load: CONNS connections that together send RATE requests/s, for SECONDS.
//
// Usage: pace_client URL CONNS RATE SECONDS  (prints one JSON line: rps, p50_ms, p99_ms, errors, requests)
//
// wrk paces connections with one timer per connection in a linear list, so with a thousand paced
// connections wrk itself adds milliseconds to every request (the same happens against a bare asyncio
// server); this client gives each connection a goroutine that sends a GET every CONNS/RATE seconds
// (start times spread evenly, the next request at once if an answer came late) and measures from
// writing the request to reading the whole answer. Answers must carry Content-Length (the sless runtime
// and the bench peers do). Run with GOMAXPROCS=1 to leave the other core to the server, as wrk -t1 does.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

func main() {
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: pace_client URL CONNS RATE SECONDS")
		os.Exit(2)
	}
	target, err := url.Parse(os.Args[1])
	if err != nil {
		panic(err)
	}
	conns, _ := strconv.Atoi(os.Args[2])
	rate, _ := strconv.ParseFloat(os.Args[3], 64)
	seconds, _ := strconv.ParseFloat(os.Args[4], 64)
	path := target.RequestURI()
	request := []byte("GET " + path + " HTTP/1.1\r\nHost: " + target.Host + "\r\n\r\n")
	interval := time.Duration(float64(conns) / rate * float64(time.Second))

	// Every connection is open before the first request: connecting is not what is measured.
	sockets := make([]net.Conn, conns)
	for i := range sockets {
		c, err := net.DialTimeout("tcp", target.Host, 10*time.Second)
		if err != nil {
			fmt.Fprintf(os.Stderr, "connection %d: %v\n", i, err)
			os.Exit(1)
		}
		sockets[i] = c
	}
	start := time.Now().Add(100 * time.Millisecond)
	end := start.Add(time.Duration(seconds * float64(time.Second)))

	var mu sync.Mutex
	var all []time.Duration
	errors := 0
	var wg sync.WaitGroup
	for i, c := range sockets {
		wg.Add(1)
		go func(i int, c net.Conn) {
			defer wg.Done()
			defer c.Close()
			lat, errs := run(c, request, start.Add(interval*time.Duration(i)/time.Duration(conns)), interval, end)
			mu.Lock()
			all = append(all, lat...)
			errors += errs
			mu.Unlock()
		}(i, c)
	}
	wg.Wait()
	sort.Slice(all, func(a, b int) bool { return all[a] < all[b] })
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		idx := int(p / 100 * float64(len(all)-1))
		return float64(all[idx]) / float64(time.Millisecond)
	}
	out, _ := json.Marshal(map[string]any{
		"rps": float64(len(all)) / seconds, "p50_ms": pct(50), "p99_ms": pct(99), "errors": errors, "requests": len(all),
	})
	fmt.Println(string(out))
}

// run drives one connection until end: its latencies and its error count.
func run(conn net.Conn, request []byte, next time.Time, interval time.Duration, end time.Time) ([]time.Duration, int) {
	reader := bufio.NewReader(conn)
	var lat []time.Duration
	errs := 0
	for {
		now := time.Now()
		if now.After(end) {
			return lat, errs
		}
		if next.After(now) {
			time.Sleep(next.Sub(now))
		}
		next = next.Add(interval)
		sent := time.Now()
		if sent.After(end) {
			return lat, errs
		}
		_ = conn.SetDeadline(sent.Add(10 * time.Second))
		if _, err := conn.Write(request); err != nil {
			return lat, errs + 1
		}
		status, err := readResponse(reader)
		if err != nil {
			return lat, errs + 1
		}
		lat = append(lat, time.Since(sent))
		if status < 200 || status > 399 {
			errs++
		}
	}
}

// readResponse reads one Content-Length framed answer and returns its status code.
func readResponse(r *bufio.Reader) (int, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	fields := strings.Fields(line)
	if len(fields) < 2 {
		return 0, fmt.Errorf("bad status line %q", line)
	}
	status, _ := strconv.Atoi(fields[1])
	length := 0
	for {
		header, err := r.ReadString('\n')
		if err != nil {
			return 0, err
		}
		header = strings.TrimRight(header, "\r\n")
		if header == "" {
			break
		}
		name, value, _ := strings.Cut(header, ":")
		if strings.EqualFold(name, "content-length") {
			length, _ = strconv.Atoi(strings.TrimSpace(value))
		}
	}
	_, err = io.CopyN(io.Discard, r, int64(length))
	return status, err
}
