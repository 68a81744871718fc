package slessrt

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// Exit codes of the runner, shared with the Python and Node runners.
const (
	exitOK       = 0
	exitFailed   = 1
	exitBadEvent = 2
	exitTimeout  = 124
)

// runOnce is the job/cron mode: one event from SLESS_EVENT, one call, the JSON
// result on stdout.
func runOnce(cfg Config, h Handler, stdout, stderr io.Writer) int {
	event, err := decodeEvent(cfg.Event)
	if err != nil {
		fmt.Fprintf(stderr, "sless: SLESS_EVENT is not a JSON object: %v\n", err)
		return exitBadEvent
	}
	addCronTick(event, os.Getenv("SLESS_CRON_JOB"))
	result, call, fail := invoke(context.Background(), h, event, cfg)
	defer call.stop(context.Canceled)
	if fail == nil {
		result, fail = collectStreams(call, result, cfg)
	}
	if fail != nil {
		if fail.kind == kindTimeout {
			fmt.Fprintln(stderr, fail.message)
			return exitTimeout
		}
		if fail.kind != kindPanic { // a panic was logged with its stack already
			fmt.Fprintf(stderr, "sless: function failed: %s: %s\n", fail.kind, fail.message)
		}
		return exitFailed
	}
	data, err := marshalJSON(result)
	if err != nil {
		fmt.Fprintf(stderr, "sless: cannot encode the result as JSON: %v\n", err)
		return exitFailed
	}
	if _, err := stdout.Write(append(data, '\n')); err != nil {
		fmt.Fprintf(stderr, "sless: cannot write the result: %v\n", err)
		return exitFailed
	}
	return exitOK
}

// resultWriter is where the result goes: SLESS_RESULT_FILE when set (the
// platform's own channel: a pipe, /dev/termination-log), so that what the
// handler prints on stdout never mixes with it; stdout otherwise.
func resultWriter(cfg Config) io.Writer {
	if cfg.ResultFile == "" {
		return os.Stdout
	}
	return &lazyFile{path: cfg.ResultFile}
}

// lazyFile opens its path on the first write: a failed run writes nothing there.
type lazyFile struct {
	path string
	file *os.File
}

func (l *lazyFile) Write(p []byte) (int, error) {
	if l.file == nil {
		f, err := openResult(l.path)
		if err != nil {
			return 0, err
		}
		l.file = f
	}
	return l.file.Write(p)
}

// openResult opens path for writing; /dev/fd/N is the inherited descriptor N
// itself (a pipe the platform passed, which a sandboxed user could not reopen).
func openResult(path string) (*os.File, error) {
	if rest, ok := strings.CutPrefix(path, "/dev/fd/"); ok {
		if fd, err := strconv.Atoi(rest); err == nil && fd >= 0 {
			return os.NewFile(uintptr(fd), path), nil
		}
	}
	return os.OpenFile(path, os.O_WRONLY|os.O_TRUNC|os.O_CREATE, 0o600)
}

// addCronTick gives a cron firing on Kubernetes the tick it was scheduled for, as
// scheduled_at (what `sless up` sends). A CronJob names each Job
// <cronjob>-<minutes since the epoch of its tick>; the pod reads that name into
// SLESS_CRON_JOB (downward API), as its event cannot hold a per-run value.
func addCronTick(event map[string]any, jobName string) {
	if event["type"] != "cron" {
		return
	}
	if _, set := event["scheduled_at"]; set {
		return
	}
	minutes, err := strconv.ParseInt(jobName[strings.LastIndex(jobName, "-")+1:], 10, 64)
	if err != nil || minutes < 0 {
		return
	}
	event["scheduled_at"] = time.Unix(minutes*60, 0).UTC().Format(time.RFC3339)
}

func decodeEvent(raw string) (map[string]any, error) {
	trimmed := bytes.TrimLeft([]byte(raw), " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, fmt.Errorf("expected an object, got %.40q", raw)
	}
	var event map[string]any
	if err := json.Unmarshal(trimmed, &event); err != nil {
		return nil, err
	}
	return event, nil
}
