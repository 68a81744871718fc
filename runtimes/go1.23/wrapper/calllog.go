package slessrt

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log"
	"os"
	"regexp"
	"sync"
)

// Per-call output tagging (runtimes/README.md, "Output of a call").
//
// Go has no ambient per-goroutine context, so a line written to os.Stdout or
// os.Stderr cannot be traced to the call whose goroutine wrote it. What can be
// known honestly is which calls were running when the line was written: both
// variables are replaced by pipes, and each call writes a begin and an end marker
// into both pipes around its handler (from the handler's own goroutine, so the
// kernel orders them with the handler's writes). A reader forwards every line to
// the real stream, tagged "@sless:<id> " when exactly one call was running, and
// untagged when none or several were. A line is therefore never given to the
// wrong call; while calls overlap, their lines are simply not attributed.
//
// Markers carry a random per-process nonce, so printed text cannot pass for one;
// an untagged line that starts with the tag marker is re-tagged "@sless:- ".

const (
	tagPrefix = "@sless:"
	noCall    = "-"
	// maxLine is the longest line kept whole; longer ones are split.
	maxLine = 64 << 10
	// HandlerMsHeader carries the handler's run time to the platform (which removes it).
	HandlerMsHeader = "X-Sless-Handler-Ms"
)

var requestIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,127}$`)

// callIDFrom is the request id a call's lines are tagged with: the header's
// value when it is one the platform makes, else "" (nothing is tagged).
func callIDFrom(value string) string {
	if requestIDPattern.MatchString(value) {
		return value
	}
	return ""
}

// tagLine renders one line (without its newline) in the documented format.
func tagLine(id string, line []byte) []byte {
	switch {
	case id != "":
		return append(append([]byte(tagPrefix+id+" "), line...), '\n')
	case bytes.HasPrefix(line, []byte(tagPrefix)):
		return append(append([]byte(tagPrefix+noCall+" "), line...), '\n')
	default:
		return append(append([]byte(nil), line...), '\n')
	}
}

// tagger owns the two pipes standing in for os.Stdout and os.Stderr.
type tagger struct {
	marker  []byte // "\x00sless-<nonce> "
	writers []*os.File
	done    sync.WaitGroup
}

// startTagging replaces os.Stdout, os.Stderr and the log package's output with
// tagging pipes; close() forwards what is left and restores nothing (the process exits).
func startTagging() (*tagger, error) {
	nonce := make([]byte, 12)
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	t := &tagger{marker: []byte("\x00sless-" + hex.EncodeToString(nonce) + " ")}
	for _, target := range []**os.File{&os.Stdout, &os.Stderr} {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		real := *target
		*target = w
		t.writers = append(t.writers, w)
		t.done.Add(1)
		go func() {
			defer t.done.Done()
			t.forward(r, real)
		}()
	}
	log.SetOutput(os.Stderr)
	return t, nil
}

// begin and end bracket one call's handler; a call without an id writes no markers.
func (t *tagger) begin(id string) { t.mark('+', id) }
func (t *tagger) end(id string)   { t.mark('-', id) }

func (t *tagger) mark(kind byte, id string) {
	if t == nil || id == "" {
		return
	}
	line := append(append(append([]byte(nil), t.marker...), kind, ' '), id...)
	line = append(line, '\n')
	for _, w := range t.writers {
		_, _ = w.Write(line) // shorter than PIPE_BUF: one atomic write
	}
}

// close ends the pipes and waits until the readers have forwarded everything.
func (t *tagger) close() {
	if t == nil {
		return
	}
	for _, w := range t.writers {
		_ = w.Close()
	}
	t.done.Wait()
}

// forward reads one pipe to its end, tagging each line by the calls open when it was written.
func (t *tagger) forward(r io.Reader, out io.Writer) {
	open := map[string]int{}
	total := 0
	reader := bufio.NewReaderSize(r, maxLine)
	var partial []byte
	emit := func(line []byte) {
		id := ""
		if total == 1 {
			for only := range open {
				id = only
			}
		}
		_, _ = out.Write(tagLine(id, line))
	}
	for {
		chunk, err := reader.ReadSlice('\n')
		if len(chunk) > 0 {
			if chunk[len(chunk)-1] != '\n' && err == bufio.ErrBufferFull {
				emit(append(partial, chunk...)) // a runaway line: split it
				partial = partial[:0]
				continue
			}
			line := append(partial, bytes.TrimSuffix(chunk, []byte("\n"))...)
			partial = partial[:0]
			if i := bytes.Index(line, t.marker); i >= 0 && bytes.HasSuffix(chunk, []byte("\n")) {
				if i > 0 {
					emit(line[:i]) // a call's last partial line, ended by its marker
				}
				t.apply(line[i+len(t.marker):], open, &total)
			} else if bytes.HasSuffix(chunk, []byte("\n")) {
				emit(line)
			} else {
				partial = append(partial, line...)
			}
		}
		if err != nil {
			if len(partial) > 0 {
				emit(partial)
			}
			return
		}
	}
}

// apply one marker body ("+ id" or "- id") to the set of running calls.
func (t *tagger) apply(body []byte, open map[string]int, total *int) {
	if len(body) < 3 {
		return
	}
	id := string(body[2:])
	switch body[0] {
	case '+':
		open[id]++
		*total++
	case '-':
		if open[id] > 0 {
			open[id]--
			*total--
			if open[id] == 0 {
				delete(open, id)
			}
		}
	}
}

// outputTags is the server's tagger (nil in the runner, and when the pipes could not be made).
var outputTags *tagger

type callIDKey struct{}

func withCallID(ctx context.Context, id string) context.Context {
	if id == "" {
		return ctx
	}
	return context.WithValue(ctx, callIDKey{}, id)
}

func callIDOf(ctx context.Context) string {
	id, _ := ctx.Value(callIDKey{}).(string)
	return id
}
