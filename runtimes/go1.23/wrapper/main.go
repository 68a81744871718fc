package slessrt

import (
	"fmt"
	"os"
	"path/filepath"
)

// Main runs the runtime around h and exits. One binary serves both modes, picked
// by the name it was started as: "runner" runs one event (jobs, cron), any
// other name (normally "server") serves HTTP.
func Main(h Handler) {
	os.Exit(Run(filepath.Base(os.Args[0]), h))
}

// Run is Main without the exit, returning the process exit code.
func Run(name string, h Handler) int {
	cfg, err := LoadConfig(os.Getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sless: bad configuration: %v\n", err)
		return 2
	}
	if name == "runner" {
		return runOnce(cfg, h, resultWriter(cfg), os.Stderr)
	}
	return serve(cfg, h)
}
