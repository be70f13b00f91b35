package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Diagnostics explain a policy run's numbers: how kvgate spread the
// requests, whether the engines ran out of KV blocks, and the CPU time
// the processes used (the machine is shared by the runner, kvgate and
// the fleet).
type Diagnostics struct {
	// Routed is how many requests kvgate sent to each worker, in worker
	// order (from kvgate_gateway_requests_routed_total).
	Routed []int
	// Preemptions and PrefixHits/PrefixQueries are summed over the
	// engines (vLLM's counters on the workers' /metrics).
	Preemptions int64
	// CPU time of kvgate, of the fleet and of the runner, and CPU time
	// the machine spent on other processes meanwhile (Linux /proc; 0
	// elsewhere): a busy machine distorts latencies.
	KvgateCPU, SimCPU, RunnerCPU, OtherCPU time.Duration
	// Wall is the run's wall-clock time, fleet start to diagnostics.
	Wall time.Duration
}

// Contention thresholds: a run is flagged when other processes took more
// than this share of the machine's CPU time, or when the runner itself
// sent requests this late (p99).
const (
	maxOtherShare = 0.10
	maxSendLag    = 100 * time.Millisecond
)

// contended says why a run's latencies may not be trustworthy ("" when
// nothing is wrong): the machine is shared, and a busy machine slows the
// simulated engines and kvgate alike.
func contended(s Summary) string {
	var why []string
	d := s.Diag
	if cpu := d.Wall.Seconds() * float64(runtime.NumCPU()); cpu > 0 && d.OtherCPU.Seconds() > maxOtherShare*cpu {
		why = append(why, fmt.Sprintf("other processes used %.0f%% of the machine's CPU", 100*d.OtherCPU.Seconds()/cpu))
	}
	if s.LagP99 > maxSendLag {
		why = append(why, fmt.Sprintf("the runner sent requests late (p99 %s)", fmtDur(s.LagP99)))
	}
	return strings.Join(why, " and ")
}

// String is a one-line summary.
func (d Diagnostics) String() string {
	return fmt.Sprintf("requests per worker %s, preemptions %d, CPU s: kvgate %.1f, fleet %.1f, runner %.1f, other processes %.1f",
		routedList(d.Routed), d.Preemptions, d.KvgateCPU.Seconds(), d.SimCPU.Seconds(), d.RunnerCPU.Seconds(), d.OtherCPU.Seconds())
}

var (
	routedRE  = regexp.MustCompile(`^kvgate_gateway_requests_routed_total\{[^}]*worker="(\d+)"[^}]*\} (\S+)$`)
	preemptRE = regexp.MustCompile(`^vllm:num_preemptions_total(?:\{[^}]*\})? (\S+)$`)
)

// cpuMark is the machine's and the runner's CPU time at the start of a
// run.
type cpuMark struct {
	busy, self time.Duration
	at         time.Time
}

func markCPU() cpuMark {
	return cpuMark{busy: machineBusy(), self: pidCPU(os.Getpid()), at: time.Now()}
}

// diagnostics reads f's metrics; what cannot be read stays zero. since is
// the CPU mark taken when the fleet started.
func (f *fleet) diagnostics(ctx context.Context, since cpuMark) Diagnostics {
	var d Diagnostics
	c := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 5 * time.Second}
	defer c.CloseIdleConnections()
	byWorker := map[uint64]int{}
	scrape(ctx, c, f.adminURL+"/metrics", func(line string) {
		if m := routedRE.FindStringSubmatch(line); m != nil {
			id, _ := strconv.ParseUint(m[1], 10, 64)
			v, _ := strconv.ParseFloat(m[2], 64)
			byWorker[id] += int(v)
		}
	})
	for _, w := range f.workers {
		d.Routed = append(d.Routed, byWorker[w.ID])
		scrape(ctx, c, w.URL+"/metrics", func(line string) {
			if m := preemptRE.FindStringSubmatch(line); m != nil {
				v, _ := strconv.ParseFloat(m[1], 64)
				d.Preemptions += int64(v)
			}
		})
	}
	d.KvgateCPU, d.SimCPU = cpuTime(f.kv), cpuTime(f.sim)
	now := markCPU()
	d.Wall = now.at.Sub(since.at)
	d.RunnerCPU = now.self - since.self
	if since.busy > 0 {
		d.OtherCPU = max(0, now.busy-since.busy-d.RunnerCPU-d.KvgateCPU-d.SimCPU)
	}
	return d
}

// scrape calls fn with each line of a Prometheus text page.
func scrape(ctx context.Context, c *http.Client, url string, fn func(string)) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return
	}
	resp, err := c.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 64<<20))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		fn(sc.Text())
	}
}

// clockTicks is Linux's USER_HZ, the unit of /proc/<pid>/stat times.
const clockTicks = 100

// cpuTime returns the user+system CPU time p used so far (Linux only).
func cpuTime(p *proc) time.Duration {
	if p == nil {
		return 0
	}
	return pidCPU(p.cmd.Process.Pid)
}

// machineBusy returns the CPU time all CPUs spent not idle since boot
// (Linux only).
func machineBusy() time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	if len(fields) < 6 || fields[0] != "cpu" {
		return 0
	}
	var busy int64
	for i, f := range fields[1:] {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0
		}
		if i != 3 && i != 4 && i < 8 { // not idle, iowait; not guest (counted in user)
			busy += v
		}
	}
	return time.Duration(busy) * time.Second / clockTicks
}

// pidCPU returns the user+system CPU time of process pid (Linux only).
func pidCPU(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses: state is
	// field 3 of stat(5), utime 14 and stime 15.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 13 {
		return 0
	}
	ut, err1 := strconv.ParseInt(fields[11], 10, 64)
	st, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(ut+st) * time.Second / clockTicks
}
