package slessrt

import (
	"bytes"
	"encoding/base64"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// X-Sless-Output (runtimes/README.md, "Output of a call"): the lines a call
// wrote before its answer's head, sent back with the answer.
//
// The lines of a call are exactly those the reader tags with it (see
// calllog.go), so before the answer's head the readers must have forwarded all
// the handler wrote. Waiting for them to pass the call's end marker costs a
// silent call a goroutine hand-off or two, so the handler's goroutine first
// checks, after its end marker, whether they have anything left but markers
// (pipe.quiet): a silent call, and one whose lines the readers kept up with,
// answer at once; only the others wait.

const (
	// OutputHeader carries a call's lines to the platform (which removes it).
	OutputHeader = "X-Sless-Output"
	// maxOutputText is the most bytes of text the header carries.
	maxOutputText = 16384
	// maxOutputLines is the most lines it carries (empty lines have no text to count).
	maxOutputLines = 1024
)

// outputWait is how long an answer waits for the readers to forward a call's
// lines, and outputGrace how much longer once that wait is over (on a busy
// node the process may have been off the CPU all along, the readers too).
// Past both, the answer goes without the header rather than stall. Only a
// call that wrote lines the readers had not passed yet waits at all; a silent
// one never does. Variables so the tests, which check what is kept and not
// how fast, can give a loaded machine all the time it needs.
var (
	outputWait  = 20 * time.Millisecond
	outputGrace = 5 * time.Millisecond
)

// The states of a call's output, set when its handler's goroutine is done.
const (
	callRunning int32 = iota // still running (the answer did not wait for it: a timeout)
	callSettled              // the readers had forwarded all it wrote
	callWrote                // the readers had lines left: the answer waits for them
)

// callOutput is what one call wrote, as its readers tag it.
type callOutput struct {
	t       *tagger // nil for a marker no call of this process began
	id      string
	seq     uint64
	marker  []byte // the marker line; mark sets its kind byte
	state   atomic.Int32
	pending atomic.Int32  // readers still to pass the end marker
	ended   chan struct{} // closed when none is

	mu        sync.Mutex
	lines     []outputLine
	size      int // bytes of text in lines
	truncated bool
	sealed    bool // the answer was made: lines from now on are not kept
}

type outputLine struct {
	Stream string  `json:"stream"`
	Text   string  `json:"text"`
	TS     float64 `json:"ts"`
}

type outputBody struct {
	Lines     []outputLine `json:"lines"`
	Truncated bool         `json:"truncated"`
}

// begin registers the call with the readers and writes its begin marker, from
// the handler's goroutine (the kernel orders the marker with its writes).
func (c *callOutput) begin() {
	if c == nil {
		return
	}
	c.t.mu.Lock()
	c.t.calls[c.seq] = c
	c.t.mu.Unlock()
	c.t.mark(c, '+')
}

// end writes the end marker and tells whether the readers had forwarded all
// the call wrote by then: only when they had not will the answer wait for them.
func (c *callOutput) end() {
	if c == nil {
		return
	}
	c.t.mark(c, '-')
	state := callSettled
	for _, p := range c.t.pipes {
		if !p.quiet() {
			state = callWrote
			break
		}
	}
	c.state.Store(state)
}

// add keeps one line the reader tagged with the call, while it fits.
func (c *callOutput) add(stream string, line []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sealed || c.truncated {
		return
	}
	if !utf8.Valid(line) { // counted as it is sent: JSON strings are UTF-8
		line = bytes.ToValidUTF8(line, []byte("\uFFFD"))
	}
	if c.size+len(line) > maxOutputText || len(c.lines) == maxOutputLines {
		c.truncated = true // this line and every later one are left out
		return
	}
	c.size += len(line)
	now := time.Now() // taken under the lock: the two readers' lines stay in time order
	c.lines = append(c.lines, outputLine{Stream: stream, Text: string(line), TS: float64(now.UnixMilli()) / 1e3})
}

// header is the X-Sless-Output value for the answer being made ("" for none);
// the call's lines from now on are not kept.
func (c *callOutput) header() string {
	if c == nil {
		return ""
	}
	if c.state.Load() == callWrote && !c.waitForReaders() {
		c.seal() // a reader is stuck (its real stream blocks): answer without
		return ""
	}
	lines, truncated := c.seal()
	if len(lines) == 0 && !truncated {
		return ""
	}
	if lines == nil {
		lines = []outputLine{}
	}
	data, _ := marshalJSON(outputBody{Lines: lines, Truncated: truncated}) // cannot fail: strings and floats
	return base64.StdEncoding.EncodeToString(data)
}

// waitForReaders tells whether the readers passed the call's end marker in time.
func (c *callOutput) waitForReaders() bool {
	select {
	case <-c.ended:
		return true
	default:
	}
	for _, wait := range []time.Duration{outputWait, outputGrace} {
		timer := time.NewTimer(wait)
		select {
		case <-c.ended:
			timer.Stop()
			return true
		case <-timer.C:
		}
	}
	return false
}

func (c *callOutput) seal() ([]outputLine, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sealed = true
	return c.lines, c.truncated
}

// handlerHeaders sets the headers every answer of a handler carries, in place
// of any the handler set of the same names: its run time and its output.
func handlerHeaders(header http.Header, handlerMs string, out *callOutput) {
	header.Del(HandlerMsHeader)
	header.Set(HandlerMsHeader, handlerMs)
	header.Del(OutputHeader)
	if value := out.header(); value != "" {
		header.Set(OutputHeader, value)
	}
}
