package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Progress shows one policy run's progress: on a terminal a bar redrawn in
// place (requests done of total, elapsed time); elsewhere nothing until
// Finish prints one line.
type Progress struct {
	w     io.Writer
	tty   bool
	label string
	total int
	start time.Time
	done  atomic.Int64

	stop chan struct{}
	wg   sync.WaitGroup
}

// progressWidth is the bar's width in characters.
const progressWidth = 30

// StartProgress starts showing the progress of total requests under
// label; Finish stops it.
func StartProgress(w io.Writer, tty bool, label string, total int, every time.Duration) *Progress {
	p := &Progress{w: w, tty: tty, label: label, total: total, start: time.Now(), stop: make(chan struct{})}
	if tty {
		p.wg.Go(func() {
			t := time.NewTicker(every)
			defer t.Stop()
			for {
				p.draw()
				select {
				case <-p.stop:
					return
				case <-t.C:
				}
			}
		})
	}
	return p
}

// Done counts one finished request.
func (p *Progress) Done() { p.done.Add(1) }

// line renders the bar.
func (p *Progress) line() string {
	n := int(p.done.Load())
	fill := 0
	if p.total > 0 {
		fill = min(progressWidth, n*progressWidth/p.total)
	}
	return fmt.Sprintf("%-28s [%s%s] %d/%d requests  %5.1fs", p.label,
		strings.Repeat("#", fill), strings.Repeat(".", progressWidth-fill), n, p.total, time.Since(p.start).Seconds())
}

func (p *Progress) draw() { fmt.Fprintf(p.w, "\r%s\x1b[K", p.line()) }

// Finish stops the bar and prints the final line with note appended.
func (p *Progress) Finish(note string) {
	close(p.stop)
	p.wg.Wait()
	if p.tty {
		fmt.Fprintf(p.w, "\r%s  %s\x1b[K\n", p.line(), note)
		return
	}
	fmt.Fprintf(p.w, "%s %d/%d requests in %.1fs  %s\n", p.label, p.done.Load(), p.total, time.Since(p.start).Seconds(), note)
}
