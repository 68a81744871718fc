// Package slessrt is the sless Go runtime: an HTTP server and a one-shot runner
// around one user function. build.sh copies these files into a temporary main
// module next to the user's package and generates a main that calls Main.
package slessrt

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// Config is every knob of the runtime, read once from the environment so that a
// bad value fails at start-up instead of at the first request.
type Config struct {
	Host         string        // SLESS_HOST, listen address
	Port         int           // PORT
	Timeout      time.Duration // SLESS_TIMEOUT_SEC, per invocation
	TimeoutText  string        // the timeout as seconds, for the "timed out after <N>s" message
	MaxBodyBytes int64         // SLESS_MAX_BODY_BYTES, larger request bodies get 413
	Drain        time.Duration // SLESS_DRAIN_SEC, how long SIGTERM waits for in-flight requests
	DrainListen  time.Duration // SLESS_DRAIN_LISTEN_SEC, how long after SIGTERM new connections are still accepted
	MaxAbandoned int           // SLESS_MAX_ABANDONED_HANDLERS, timed-out handlers still running before a recycle
	Event        string        // SLESS_EVENT, runner only
	ResultFile   string        // SLESS_RESULT_FILE, runner only: where the result goes instead of stdout
}

// LoadConfig reads the configuration through getenv (os.Getenv in production) and
// applies the contract's defaults to unset variables.
func LoadConfig(getenv func(string) string) (Config, error) {
	cfg := Config{Host: "0.0.0.0", Event: "{}"}
	if v := getenv("SLESS_HOST"); v != "" {
		cfg.Host = v
	}
	if v := getenv("SLESS_EVENT"); v != "" {
		cfg.Event = v
	}
	cfg.ResultFile = getenv("SLESS_RESULT_FILE")
	port, err := intVar(getenv, "PORT", 8080)
	if err != nil {
		return cfg, err
	}
	if port < 0 || port > 65535 {
		return cfg, fmt.Errorf("PORT=%d is not a TCP port", port)
	}
	cfg.Port = port
	maxBody, err := intVar(getenv, "SLESS_MAX_BODY_BYTES", 6291456)
	if err != nil {
		return cfg, err
	}
	if maxBody < 0 {
		return cfg, fmt.Errorf("SLESS_MAX_BODY_BYTES=%d must not be negative", maxBody)
	}
	cfg.MaxBodyBytes = int64(maxBody)
	timeout, err := secondsVar(getenv, "SLESS_TIMEOUT_SEC", 30)
	if err != nil {
		return cfg, err
	}
	if timeout <= 0 {
		return cfg, fmt.Errorf("SLESS_TIMEOUT_SEC must be positive")
	}
	cfg.Timeout = toDuration(timeout)
	cfg.TimeoutText = strconv.FormatFloat(timeout, 'f', -1, 64)
	drain, err := secondsVar(getenv, "SLESS_DRAIN_SEC", 25)
	if err != nil {
		return cfg, err
	}
	if drain < 0 {
		return cfg, fmt.Errorf("SLESS_DRAIN_SEC must not be negative")
	}
	cfg.Drain = toDuration(drain)
	drainListen, err := secondsVar(getenv, "SLESS_DRAIN_LISTEN_SEC", 0)
	if err != nil {
		return cfg, err
	}
	if drainListen < 0 {
		return cfg, fmt.Errorf("SLESS_DRAIN_LISTEN_SEC must not be negative")
	}
	cfg.DrainListen = min(toDuration(drainListen), cfg.Drain)
	maxAbandoned, err := intVar(getenv, "SLESS_MAX_ABANDONED_HANDLERS", 8)
	if err != nil {
		return cfg, err
	}
	if maxAbandoned < 1 {
		return cfg, fmt.Errorf("SLESS_MAX_ABANDONED_HANDLERS must be at least 1")
	}
	cfg.MaxAbandoned = maxAbandoned
	return cfg, nil
}

func intVar(getenv func(string) string, name string, def int) (int, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q is not an integer", name, v)
	}
	return n, nil
}

func secondsVar(getenv func(string) string, name string, def float64) (float64, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%s=%q is not a number of seconds", name, v)
	}
	return f, nil
}

// toDuration caps huge values instead of overflowing time.Duration (about 292 years).
func toDuration(seconds float64) time.Duration {
	if seconds >= math.MaxInt64/float64(time.Second) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(seconds * float64(time.Second))
}
