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
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
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
	// maxMarkerBody is the longest marker after its nonce: "+ <seq> <id>\n".
	maxMarkerBody = 2 + 20 + 1 + 128 + 1
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
	marker []byte // "\x00sless-<nonce> "
	pipes  []*pipe
	done   sync.WaitGroup
	seq    atomic.Uint64
	mu     sync.Mutex
	calls  map[uint64]*callOutput // begun calls whose end marker a reader has still to pass
}

// pipe is one tagged stream: handlers write into w, a reader forwards what it reads.
type pipe struct {
	stream string          // "stdout" or "stderr", as X-Sless-Output names it
	w      *os.File        // the write end, in place of os.Stdout or os.Stderr
	r      *os.File        // the read end
	raw    syscall.RawConn // r's, to count what the reader takes out
	// What went through the pipe, for quiet: bytes in it so far (taken plus
	// those still queued), markers among them, and how far the reader got.
	gen              atomic.Uint64 // odd while the reader is taking bytes out
	taken            atomic.Int64  // bytes the reader has taken out
	markers          atomic.Int64  // marker bytes written (counted once written)
	forwarded        atomic.Int64  // bytes the reader has forwarded or applied
	markersForwarded atomic.Int64  // marker bytes among them (counted first)
}

// startTagging replaces os.Stdout, os.Stderr and the log package's output with
// tagging pipes; close() forwards what is left and restores nothing (the process exits).
func startTagging() (*tagger, error) {
	t, err := newTagger()
	if err != nil {
		return nil, err
	}
	t.start(os.Stdout, os.Stderr)
	os.Stdout, os.Stderr = t.pipes[0].w, t.pipes[1].w
	log.SetOutput(os.Stderr)
	return t, nil
}

// newTagger makes the two pipes; start runs their readers.
func newTagger() (*tagger, error) {
	nonce := make([]byte, 12)
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	t := &tagger{marker: []byte("\x00sless-" + hex.EncodeToString(nonce) + " "), calls: map[uint64]*callOutput{}}
	for _, stream := range []string{"stdout", "stderr"} {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		raw, err := r.SyscallConn()
		if err != nil {
			return nil, err
		}
		t.pipes = append(t.pipes, &pipe{stream: stream, w: w, r: r, raw: raw})
	}
	return t, nil
}

// start runs a reader per pipe, forwarding to stdout and stderr.
func (t *tagger) start(stdout, stderr io.Writer) {
	for i, out := range []io.Writer{stdout, stderr} {
		p := t.pipes[i]
		t.done.Add(1)
		go func() {
			defer t.done.Done()
			t.forward(p, out)
		}()
	}
}

// newCall is the output record of a call tagged id (nil when nothing is tagged).
func (t *tagger) newCall(id string) *callOutput {
	if t == nil || id == "" {
		return nil
	}
	c := &callOutput{t: t, id: id, seq: t.seq.Add(1), ended: make(chan struct{})}
	c.marker = strconv.AppendUint(append(append([]byte(nil), t.marker...), '+', ' '), c.seq, 10)
	c.marker = append(append(append(c.marker, ' '), id...), '\n')
	c.pending.Store(int32(len(t.pipes)))
	return c
}

// mark writes the call's begin ('+') or end ('-') marker into every pipe.
func (t *tagger) mark(c *callOutput, kind byte) {
	c.marker[len(t.marker)] = kind
	for _, p := range t.pipes {
		if n, _ := p.w.Write(c.marker); n == len(c.marker) { // shorter than PIPE_BUF: one atomic write
			p.markers.Add(int64(n))
		}
	}
}

// quiet tells, without waiting for the reader, that it has nothing left to
// forward but markers: every line written into the pipe so far has been
// forwarded, and kept by its call. False also when it cannot be told.
//
// The counts are read in an order that can make lines seem left when there
// are none, never the reverse: forwarded before markersForwarded (the reader
// counts a marker before it moves forwarded past it), markers before written
// (a marker is counted once written), written last.
func (p *pipe) quiet() bool {
	forwarded := p.forwarded.Load()
	markersForwarded := p.markersForwarded.Load()
	markers := p.markers.Load()
	written, ok := p.written()
	return ok && written-forwarded == markers-markersForwarded
}

// written is how many bytes the pipe has been given so far: those the reader
// took out plus those still queued, counted while no read was under way (else
// the two would not add up). False when a read was under way each time.
func (p *pipe) written() (int64, bool) {
	for range 3 {
		gen := p.gen.Load()
		if gen%2 == 1 {
			continue
		}
		taken := p.taken.Load()
		queued, err := queuedBytes(p.raw)
		if err != nil {
			return 0, false
		}
		if p.gen.Load() == gen {
			return taken + queued, true
		}
	}
	return 0, false
}

// Read is the reader's side of the pipe, counting what it takes out (see written).
func (p *pipe) Read(b []byte) (int, error) {
	var n int
	var err error
	waitErr := p.raw.Read(func(fd uintptr) bool {
		p.gen.Add(1)
		for {
			n, err = syscall.Read(int(fd), b)
			if err != syscall.EINTR {
				break
			}
		}
		if n > 0 {
			p.taken.Add(int64(n))
		}
		p.gen.Add(1)
		return err != syscall.EAGAIN // false: wait until the pipe is readable, then call again
	})
	switch {
	case waitErr != nil:
		return 0, waitErr
	case err != nil:
		return 0, err
	case n == 0:
		return 0, io.EOF // every write end is closed
	}
	return n, nil
}

// close ends the pipes and waits until the readers have forwarded everything.
func (t *tagger) close() {
	if t == nil {
		return
	}
	for _, p := range t.pipes {
		_ = p.w.Close()
	}
	t.done.Wait()
}

// forward reads one pipe to its end, tagging each line by the calls open when
// it was written; a line tagged with a call also goes into the call's record.
func (t *tagger) forward(p *pipe, out io.Writer) {
	open := map[uint64]*callOutput{}
	reader := bufio.NewReaderSize(p, maxLine)
	var offset int64 // where chunk ends in the pipe
	var partial []byte
	emit := func(line []byte) {
		if len(open) != 1 {
			_, _ = out.Write(tagLine("", line))
			return
		}
		for _, only := range open {
			_, _ = out.Write(tagLine(only.id, line))
			only.add(p.stream, line)
		}
	}
	for {
		chunk, err := reader.ReadSlice('\n')
		offset += int64(len(chunk))
		if len(chunk) > 0 {
			if chunk[len(chunk)-1] != '\n' && err == bufio.ErrBufferFull {
				// A runaway line: split it, keeping back what may begin a marker
				// (forwarded as text, it would leave its call open for good).
				keep := t.markerStart(chunk)
				emit(append(partial, chunk[:keep]...))
				partial = append(partial[:0], chunk[keep:]...)
				p.forwarded.Store(offset - int64(len(partial)))
				continue
			}
			line := append(partial, bytes.TrimSuffix(chunk, []byte("\n"))...)
			partial = partial[:0]
			if i := bytes.Index(line, t.marker); i >= 0 && bytes.HasSuffix(chunk, []byte("\n")) {
				if i > 0 {
					emit(line[:i]) // a call's last partial line, ended by its marker
				}
				p.markersForwarded.Add(int64(len(line) - i + 1)) // and its newline
				t.apply(line[i+len(t.marker):], open)
			} else if bytes.HasSuffix(chunk, []byte("\n")) {
				emit(line)
			} else {
				partial = append(partial, line...)
			}
			p.forwarded.Store(offset)
		}
		if err != nil {
			if len(partial) > 0 {
				emit(partial)
			}
			return
		}
	}
}

// markerStart is where a marker that chunk ends inside of begins, else len(chunk).
func (t *tagger) markerStart(chunk []byte) int {
	tail := max(0, len(chunk)-len(t.marker)-maxMarkerBody)
	i := bytes.LastIndexByte(chunk[tail:], t.marker[0])
	if i < 0 {
		return len(chunk)
	}
	rest := chunk[tail+i:]
	if bytes.HasPrefix(rest, t.marker) || bytes.HasPrefix(t.marker, rest) {
		return tail + i
	}
	return len(chunk)
}

// apply one marker body ("+ seq id" or "- seq id") to the set of running calls.
func (t *tagger) apply(body []byte, open map[uint64]*callOutput) {
	if len(body) < 3 {
		return
	}
	seqText, id, found := bytes.Cut(body[2:], []byte(" "))
	seq, err := strconv.ParseUint(string(seqText), 10, 64)
	if !found || err != nil {
		return
	}
	switch body[0] {
	case '+':
		t.mu.Lock()
		c := t.calls[seq]
		t.mu.Unlock()
		if c == nil { // not begun by newCall: tag its lines, keep none
			c = &callOutput{id: string(id), sealed: true}
		}
		open[seq] = c
	case '-':
		if c, ok := open[seq]; ok {
			delete(open, seq)
			t.passed(c)
		}
	}
}

// passed: a reader has forwarded everything c wrote into its pipe.
func (t *tagger) passed(c *callOutput) {
	if c.t == nil || c.pending.Add(-1) != 0 {
		return
	}
	t.mu.Lock()
	delete(t.calls, c.seq)
	t.mu.Unlock()
	close(c.ended)
}

// outputTags is the server's tagger (nil in the runner, and when the pipes could not be made).
var outputTags *tagger

type callOutputKey struct{}

func withCallOutput(ctx context.Context, c *callOutput) context.Context {
	if c == nil {
		return ctx
	}
	return context.WithValue(ctx, callOutputKey{}, c)
}

func callOutputOf(ctx context.Context) *callOutput {
	c, _ := ctx.Value(callOutputKey{}).(*callOutput)
	return c
}
