package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	dfake "k8s.io/client-go/dynamic/fake"
	kfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kvgate/kvgate/bench/engine"
	"github.com/kvgate/kvgate/bench/engine/enginetest"
	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/indexer/kvevents"
	"github.com/kvgate/kvgate/internal/listeners"
	"github.com/kvgate/kvgate/internal/poll"
	"github.com/kvgate/kvgate/scheduler"
	"github.com/kvgate/kvgate/scheduler/catalog"
)

// The tests run a real catalog (with its ingester and index set) against
// client-go's fake clientsets; pod IPs are loopback addresses, so that the
// listeners of the default event endpoints fail fast, and the listener
// test's pod publishes on a real ZMQ socket.

const (
	testNS    = "inference"
	testPool  = "vllm-pool"
	testModel = "m"
	testBS    = 4
)

var quiet = slog.New(slog.DiscardHandler)

// tWriter sends log lines to the test log, shown on failure.
type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// harness is a real catalog and a Discovery on fake clientsets.
type harness struct {
	t    *testing.T
	kube *kfake.Clientset
	dyn  *dfake.FakeDynamicClient
	ing  *kvevents.Ingester
	cat  *catalog.Catalog
	reg  *prometheus.Registry
	d    *Discovery

	// The fakes' watches: a deletion between an informer's list and its
	// watch is lost, so mutations wait for the watches (settle).
	poolWatches       atomic.Int64
	poolWatchesWanted int64 // when not all versions are served; default all
	mu                sync.Mutex
	podWatched        []string // label selectors of pod watches, in order
	sel               string   // selector discovery should watch ("" none)
	mark              int      // podWatched index from which a watch of sel counts

	static []string // view lines of workers the test registered itself
}

// newHarness builds the harness; wrap, if not nil, puts a Catalog between
// Discovery and the real catalog. Call start to run the Discovery.
func newHarness(t *testing.T, cfg Config, wrap func(*catalog.Catalog) Catalog) *harness {
	t.Helper()
	h := &harness{t: t, reg: prometheus.NewRegistry()}
	set := indexer.NewSet(indexer.Options{EventThreads: 2})
	h.ing = kvevents.NewIngester(set, kvevents.IngestOptions{Logger: quiet, MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, FailAfter: 2})
	h.cat = catalog.New(set, listeners.New(h.ing), nil, catalog.Options{Logger: quiet, UnregisterTimeout: 10 * time.Second})
	t.Cleanup(func() {
		h.ing.Close()
		set.Close()
	})

	h.kube = kfake.NewClientset()
	h.kube.PrependWatchReactor("pods", func(a k8stesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := a.(k8stesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		w, err := h.kube.Tracker().Watch(a.GetResource(), a.GetNamespace(), opts)
		if err == nil {
			h.mu.Lock()
			h.podWatched = append(h.podWatched, opts.LabelSelector)
			h.mu.Unlock()
		}
		return true, w, err
	})
	h.dyn = dfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		poolGVR(APIVersionV1):       "InferencePoolList",
		poolGVR(APIVersionV1Alpha2): "InferencePoolList",
	})
	h.dyn.PrependWatchReactor(poolResource, func(a k8stesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := a.(k8stesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		w, err := h.dyn.Tracker().Watch(a.GetResource(), a.GetNamespace(), opts)
		if err == nil {
			h.poolWatches.Add(1)
		}
		return true, w, err
	})

	if cfg.PoolName == "" {
		cfg.PoolName, cfg.PoolNamespace = testPool, testNS
	}
	if cfg.Model == "" && cfg.ModelLabel == "" {
		cfg.Model = testModel
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = testBS
	}
	cfg.Logger = slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var cat Catalog = h.cat
	if wrap != nil {
		cat = wrap(h.cat)
	}
	d, err := New(h.kube, h.dyn, cat, cfg, h.reg)
	if err != nil {
		t.Fatal(err)
	}
	d.minRetry = 5 * time.Millisecond
	h.d = d
	return h
}

// start runs the Discovery until the test ends.
func (h *harness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.d.Run(ctx) }()
	h.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			h.t.Errorf("Run: %v", err)
		}
	})
}

// settle waits until the pool watches and the pod watch of the selector
// last set are established.
func (h *harness) settle() {
	h.t.Helper()
	poll.Until(h.t, "watches established", func() bool {
		want := int64(len(h.d.versions))
		if h.poolWatchesWanted > 0 {
			want = h.poolWatchesWanted
		}
		if h.poolWatches.Load() < want {
			return false
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.sel == "" || slices.Contains(h.podWatched[h.mark:], h.sel)
	})
}

// expectSelector notes that discovery should now watch pods with sel (nil:
// none); when that is a change, by a watch started from now on.
func (h *harness) expectSelector(sel map[string]string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := ""
	if sel != nil {
		s = labels.SelectorFromSet(sel).String()
	}
	if s != h.sel {
		h.sel, h.mark = s, len(h.podWatched)
	}
}

// inferencePool returns a pool of apiVersion with selector sel and target
// ports (v1alpha2 takes the first).
func inferencePool(apiVersion string, sel map[string]string, ports ...int64) *unstructured.Unstructured {
	labels := make(map[string]any, len(sel))
	for k, v := range sel {
		labels[k] = v
	}
	spec := map[string]any{}
	switch apiVersion {
	case APIVersionV1:
		tp := make([]any, len(ports))
		for i, p := range ports {
			tp[i] = map[string]any{"number": p}
		}
		spec["selector"] = map[string]any{"matchLabels": labels}
		spec["targetPorts"] = tp
		spec["endpointPickerRef"] = map[string]any{"kind": "Service", "name": "kvgate", "port": map[string]any{"number": int64(9002)}}
	case APIVersionV1Alpha2:
		spec["selector"] = labels
		spec["targetPortNumber"] = ports[0]
		spec["extensionRef"] = map[string]any{"name": "kvgate"}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": apiVersion,
		"kind":       "InferencePool",
		"metadata":   map[string]any{"name": testPool, "namespace": testNS},
		"spec":       spec,
	}}
}

// putPool creates or updates the pool in apiVersion.
func (h *harness) putPool(apiVersion string, sel map[string]string, ports ...int64) {
	h.t.Helper()
	h.expectSelector(sel)
	res := h.dyn.Resource(poolGVR(apiVersion)).Namespace(testNS)
	u := inferencePool(apiVersion, sel, ports...)
	ctx := context.Background()
	if _, err := res.Get(ctx, testPool, metav1.GetOptions{}); err == nil {
		_, err = res.Update(ctx, u, metav1.UpdateOptions{})
		if err != nil {
			h.t.Fatal(err)
		}
		return
	}
	if _, err := res.Create(ctx, u, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// deletePool deletes the pool in apiVersion; next, if not nil, is the
// selector of the pool that remains in another version.
func (h *harness) deletePool(apiVersion string, next map[string]string) {
	h.t.Helper()
	h.settle()
	h.expectSelector(next)
	if err := h.dyn.Resource(poolGVR(apiVersion)).Namespace(testNS).Delete(context.Background(), testPool, metav1.DeleteOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

var vllm = map[string]string{"app": "vllm"}

type podOption func(*corev1.Pod)

func withLabels(kv ...string) podOption {
	return func(p *corev1.Pod) {
		p.Labels = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			p.Labels[kv[i]] = kv[i+1]
		}
	}
}

func withAnnotation(k, v string) podOption {
	return func(p *corev1.Pod) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[k] = v
	}
}

func ready(ok bool) podOption {
	return func(p *corev1.Pod) {
		s := corev1.ConditionFalse
		if ok {
			s = corev1.ConditionTrue
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: s}}
	}
}

func withIP(ip string) podOption { return func(p *corev1.Pod) { p.Status.PodIP = ip } }

// newPod returns a Ready pod labelled app=vllm at ip, with opts applied.
func newPod(name, ip string, opts ...podOption) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, Labels: map[string]string{"app": "vllm"}},
		Status:     corev1.PodStatus{PodIP: ip, Phase: corev1.PodRunning},
	}
	ready(true)(p)
	for _, o := range opts {
		o(p)
	}
	return p
}

func (h *harness) createPod(p *corev1.Pod) {
	h.t.Helper()
	h.settle()
	if _, err := h.kube.CoreV1().Pods(testNS).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) updatePod(name string, opts ...podOption) {
	h.t.Helper()
	h.settle()
	pods := h.kube.CoreV1().Pods(testNS)
	p, err := pods.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	for _, o := range opts {
		o(p)
	}
	if _, err := pods.Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) deletePod(name string) {
	h.t.Helper()
	h.settle()
	if err := h.kube.CoreV1().Pods(testNS).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// want is an expected catalog worker.
type want struct {
	model, pod, ip string
	rank, port     int
	events, replay string // "" none
	source         string
}

// discovered is the worker of rank of pod at ip with target port port and
// the default event template.
func discovered(pod, ip string, rank, port int) want {
	return want{model: testModel, pod: pod, ip: ip, rank: rank, port: port,
		events: fmt.Sprintf("tcp://%s:%d", ip, 5557+rank), source: Source}
}

func (w want) line() string {
	return fmt.Sprintf("%s id=%d endpoint=%s ranks=[%d] events=%q replay=%q source=%s", w.model, WorkerID(testNS, w.pod, w.rank),
		net.JoinHostPort(w.ip, strconv.Itoa(w.port)), w.rank, w.events, w.replay, w.source)
}

// view describes the catalog's workers of every model, like want.line.
func (h *harness) view() []string {
	var out []string
	for _, w := range h.cat.Workers("", indexer.DefaultTenant) {
		var events, replay []string
		for _, r := range w.Ranks {
			if p, ok := w.Events[r]; ok {
				events, replay = append(events, p.Endpoint), append(replay, p.Replay)
			}
		}
		out = append(out, fmt.Sprintf("%s id=%d endpoint=%s ranks=%v events=%q replay=%q source=%s", w.Key.Model, w.ID, w.Endpoint, w.Ranks,
			strings.Join(events, ","), strings.Join(replay, ","), w.Source))
	}
	slices.Sort(out)
	return out
}

// expect waits until the catalog holds exactly ws (plus static, the
// workers the test registered itself).
func (h *harness) expect(what string, ws ...want) {
	h.t.Helper()
	lines := slices.Clone(h.static)
	for _, w := range ws {
		lines = append(lines, w.line())
	}
	slices.Sort(lines)
	var last []string
	defer func() {
		if !slices.Equal(last, lines) {
			h.t.Logf("%s: catalog holds\n  %s\nwant\n  %s", what, strings.Join(last, "\n  "), strings.Join(lines, "\n  "))
		}
	}()
	poll.Until(h.t, what, func() bool {
		last = h.view()
		return slices.Equal(last, lines)
	})
}

// metric returns the value of one of the discovery's metrics.
func (h *harness) metric(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }

// metricReaches waits for a metric that discovery sets after the catalog
// change a test has just seen (expect returns as soon as the catalog shows
// it, which can be before the runner counts it) to read want.
func (h *harness) metricReaches(what string, c prometheus.Collector, want float64) {
	h.t.Helper()
	var got float64
	defer func() {
		if got != want {
			h.t.Logf("%s = %v, want %v", what, got, want)
		}
	}()
	poll.Until(h.t, what, func() bool { got = h.metric(c); return got == want })
}

func TestPodLifecycle(t *testing.T) {
	h := newHarness(t, Config{}, nil)
	// A worker registered by hand, with an id discovery would give
	// another pod: discovery must leave it alone.
	static := catalog.WorkerSpec{
		WorkerKey: catalog.WorkerKey{Key: indexer.Key{Model: testModel, Tenant: indexer.DefaultTenant}, ID: 7},
		BlockSize: testBS, Endpoint: "127.0.0.99:8000", DPStart: 0, DPSize: 1, Source: catalog.SourceAPI,
	}
	if err := h.cat.PutWorker(static); err != nil {
		t.Fatal(err)
	}
	h.static = []string{fmt.Sprintf("%s id=7 endpoint=127.0.0.99:8000 ranks=[0] events=\"\" replay=\"\" source=api", testModel)}
	h.start()
	h.putPool(APIVersionV1, vllm, 8000, 8001)
	h.createPod(newPod("a", "127.0.0.2"))
	h.createPod(newPod("b", "127.0.0.3", ready(false)))
	h.createPod(newPod("other", "127.0.0.4", withLabels("app", "other")))
	h.createPod(newPod("noip", "", withLabels("app", "vllm")))

	h.expect("ready pod a's two ranks", discovered("a", "127.0.0.2", 0, 8000), discovered("a", "127.0.0.2", 1, 8001))
	poll.Until(t, "pods gauge", func() bool {
		return h.metric(h.d.m.pods.WithLabelValues("ready")) == 1 && h.metric(h.d.m.pods.WithLabelValues("unready")) == 2
	})

	h.updatePod("b", ready(true))
	h.expect("b ready",
		discovered("a", "127.0.0.2", 0, 8000), discovered("a", "127.0.0.2", 1, 8001),
		discovered("b", "127.0.0.3", 0, 8000), discovered("b", "127.0.0.3", 1, 8001))

	h.updatePod("a", withIP("127.0.0.5"))
	h.expect("a's new IP",
		discovered("a", "127.0.0.5", 0, 8000), discovered("a", "127.0.0.5", 1, 8001),
		discovered("b", "127.0.0.3", 0, 8000), discovered("b", "127.0.0.3", 1, 8001))

	h.updatePod("a", ready(false))
	h.expect("a not ready", discovered("b", "127.0.0.3", 0, 8000), discovered("b", "127.0.0.3", 1, 8001))

	h.updatePod("a", ready(true))
	h.updatePod("b", func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: time.Now()} })
	h.expect("b terminating", discovered("a", "127.0.0.5", 0, 8000), discovered("a", "127.0.0.5", 1, 8001))

	h.updatePod("a", withLabels("app", "moved"))
	h.expect("a relabelled out of the pool")
	h.updatePod("a", withLabels("app", "vllm"))
	h.expect("a back", discovered("a", "127.0.0.5", 0, 8000), discovered("a", "127.0.0.5", 1, 8001))

	h.deletePod("a")
	h.expect("a deleted")
	h.metricReaches("kvgate_discovery_workers after every pod went", h.d.m.workers, 0)
	if got := h.metric(h.d.m.changes.WithLabelValues(opPut, outcomeError)); got != 0 {
		t.Errorf("failed registrations = %v, want 0", got)
	}
	// a: 2 at first, 2 for the new IP, 2 when ready again, 2 when back; b: 2.
	if got := h.metric(h.d.m.changes.WithLabelValues(opPut, outcomeOK)); got != 10 {
		t.Errorf("registrations = %v, want 10", got)
	}
}

func TestPoolChanges(t *testing.T) {
	h := newHarness(t, Config{APIVersion: "v1"}, nil)
	// The pool and a pod exist before discovery starts.
	h.putPool(APIVersionV1, vllm, 8000, 8001)
	h.createPodNoSettle(newPod("a", "127.0.0.2"))
	h.createPodNoSettle(newPod("b", "127.0.0.3", withLabels("app", "vllm", "tier", "new")))
	h.start()
	h.expect("initial list",
		discovered("a", "127.0.0.2", 0, 8000), discovered("a", "127.0.0.2", 1, 8001),
		discovered("b", "127.0.0.3", 0, 8000), discovered("b", "127.0.0.3", 1, 8001))

	h.putPool(APIVersionV1, map[string]string{"app": "vllm", "tier": "new"}, 8000, 8001)
	h.expect("narrower selector", discovered("b", "127.0.0.3", 0, 8000), discovered("b", "127.0.0.3", 1, 8001))
	h.createPod(newPod("c", "127.0.0.4", withLabels("app", "vllm", "tier", "new")))
	h.expect("pod of the new selector",
		discovered("b", "127.0.0.3", 0, 8000), discovered("b", "127.0.0.3", 1, 8001),
		discovered("c", "127.0.0.4", 0, 8000), discovered("c", "127.0.0.4", 1, 8001))

	h.putPool(APIVersionV1, map[string]string{"app": "vllm", "tier": "new"}, 9000)
	h.expect("one target port", discovered("b", "127.0.0.3", 0, 9000), discovered("c", "127.0.0.4", 0, 9000))
	h.putPool(APIVersionV1, map[string]string{"app": "vllm", "tier": "new"}, 9000, 9001, 9002)
	h.expect("three target ports",
		discovered("b", "127.0.0.3", 0, 9000), discovered("b", "127.0.0.3", 1, 9001), discovered("b", "127.0.0.3", 2, 9002),
		discovered("c", "127.0.0.4", 0, 9000), discovered("c", "127.0.0.4", 1, 9001), discovered("c", "127.0.0.4", 2, 9002))

	h.deletePod("c") // while the pool's watch follows the new selector
	h.expect("c deleted", discovered("b", "127.0.0.3", 0, 9000), discovered("b", "127.0.0.3", 1, 9001), discovered("b", "127.0.0.3", 2, 9002))

	h.deletePool(APIVersionV1, nil)
	h.expect("pool deleted")
	if got := h.metric(h.d.m.pool); got != 0 {
		t.Errorf("kvgate_discovery_pool_found = %v after the pool's deletion", got)
	}
	h.putPool(APIVersionV1, vllm, 8000)
	h.expect("pool recreated", discovered("a", "127.0.0.2", 0, 8000), discovered("b", "127.0.0.3", 0, 8000))

	// An invalid pool counts as none.
	errsBefore := h.metric(h.d.m.errors.WithLabelValues(errPool))
	h.expectSelector(nil)
	bad := inferencePool(APIVersionV1, vllm, 8000)
	if err := unstructured.SetNestedSlice(bad.Object, []any{}, "spec", "targetPorts"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.dyn.Resource(poolGVR(APIVersionV1)).Namespace(testNS).Update(context.Background(), bad, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.expect("pool without target ports")
	if got := h.metric(h.d.m.errors.WithLabelValues(errPool)); got != errsBefore+1 {
		t.Errorf("pool errors = %v, want %v", got, errsBefore+1)
	}
	// The first, the new selector's and the recreated pool's; an invalid
	// pool stops the watch.
	if got := h.metric(h.d.m.podWatches); got != 3 {
		t.Errorf("pod watches started = %v, want 3", got)
	}
}

// createPodNoSettle creates a pod before discovery runs.
func (h *harness) createPodNoSettle(p *corev1.Pod) {
	h.t.Helper()
	if _, err := h.kube.CoreV1().Pods(testNS).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

func TestAPIVersions(t *testing.T) {
	t.Run("auto", func(t *testing.T) {
		h := newHarness(t, Config{}, nil)
		h.start()
		h.createPod(newPod("a", "127.0.0.2"))
		h.putPool(APIVersionV1Alpha2, vllm, 8000, 8001) // v1alpha2 has one target port
		h.expect("v1alpha2 pool", discovered("a", "127.0.0.2", 0, 8000))
		h.putPool(APIVersionV1, vllm, 9000, 9001)
		h.expect("v1 pool wins", discovered("a", "127.0.0.2", 0, 9000), discovered("a", "127.0.0.2", 1, 9001))
		h.deletePool(APIVersionV1, vllm)
		h.expect("back to v1alpha2", discovered("a", "127.0.0.2", 0, 8000))
		h.deletePool(APIVersionV1Alpha2, nil)
		h.expect("no pool")
	})
	t.Run("explicit v1alpha2", func(t *testing.T) {
		h := newHarness(t, Config{APIVersion: APIVersionV1Alpha2}, nil)
		h.putPool(APIVersionV1, map[string]string{"app": "v1"}, 9000)
		h.putPool(APIVersionV1Alpha2, vllm, 8000)
		h.createPodNoSettle(newPod("a", "127.0.0.2"))
		h.createPodNoSettle(newPod("b", "127.0.0.3", withLabels("app", "v1")))
		h.start()
		h.expect("the v1alpha2 pool only", discovered("a", "127.0.0.2", 0, 8000))
		h.noActionsOn(APIVersionV1)
	})
	t.Run("explicit v1", func(t *testing.T) {
		h := newHarness(t, Config{APIVersion: "v1"}, nil)
		h.putPool(APIVersionV1Alpha2, vllm, 8000)
		h.expectSelector(nil) // discovery ignores that pool
		h.createPodNoSettle(newPod("a", "127.0.0.2"))
		h.start()
		h.settle()
		// Nothing to wait for: discovery must not register anything, so
		// create the v1 pool with another port and see only that.
		h.putPool(APIVersionV1, vllm, 9000)
		h.expect("the v1 pool only", discovered("a", "127.0.0.2", 0, 9000))
		h.metricReaches("registrations (none from the v1alpha2 pool)", h.d.m.changes.WithLabelValues(opPut, outcomeOK), 1)
		h.noActionsOn(APIVersionV1Alpha2)
	})
	notServed := func(h *harness, apiVersion string) {
		gvr := poolGVR(apiVersion)
		h.dyn.PrependReactor("list", poolResource, func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetResource() != gvr {
				return false, nil, nil
			}
			return true, nil, apierrors.NewNotFound(gvr.GroupResource(), "")
		})
		h.poolWatchesWanted = 1
	}
	t.Run("auto, v1 not served", func(t *testing.T) {
		h := newHarness(t, Config{}, nil)
		notServed(h, APIVersionV1)
		h.start()
		h.putPool(APIVersionV1Alpha2, vllm, 8000)
		h.createPod(newPod("a", "127.0.0.2"))
		h.expect("the v1alpha2 pool", discovered("a", "127.0.0.2", 0, 8000))
		if got := h.metric(h.d.m.errors.WithLabelValues(errWatch)); got != 0 {
			t.Errorf("watch errors = %v; a version auto mode does not find is no error", got)
		}
	})
	t.Run("explicit v1 not served", func(t *testing.T) {
		h := newHarness(t, Config{APIVersion: "v1"}, nil)
		notServed(h, APIVersionV1)
		h.start()
		poll.Until(t, "watch error counted", func() bool { return h.metric(h.d.m.errors.WithLabelValues(errWatch)) >= 1 })
	})
}

// noActionsOn fails the test if discovery used the pool API apiVersion.
func (h *harness) noActionsOn(apiVersion string) {
	h.t.Helper()
	for _, a := range h.dyn.Actions() {
		if a.GetResource() == poolGVR(apiVersion) && a.GetVerb() != "create" && a.GetVerb() != "get" && a.GetVerb() != "update" {
			h.t.Errorf("discovery used %s: %s", apiVersion, a.GetVerb())
		}
	}
}

func TestModelFromLabel(t *testing.T) {
	h := newHarness(t, Config{Model: "fallback", ModelLabel: "kvgate.io/model"}, nil)
	h.start()
	h.putPool(APIVersionV1, vllm, 8000)
	h.createPod(newPod("a", "127.0.0.2", withLabels("app", "vllm", "kvgate.io/model", "llama")))
	h.createPod(newPod("b", "127.0.0.3"))
	h.createPod(newPod("c", "127.0.0.4", withLabels("app", "vllm", "kvgate.io/model", "")))
	inModel := func(w want, model string) want { w.model = model; return w }
	h.expect("models from labels",
		inModel(discovered("a", "127.0.0.2", 0, 8000), "llama"),
		inModel(discovered("b", "127.0.0.3", 0, 8000), "fallback"),
		inModel(discovered("c", "127.0.0.4", 0, 8000), "fallback"))
	h.updatePod("b", withLabels("app", "vllm", "kvgate.io/model", "qwen"))
	h.expect("b's model changed",
		inModel(discovered("a", "127.0.0.2", 0, 8000), "llama"),
		inModel(discovered("b", "127.0.0.3", 0, 8000), "qwen"),
		inModel(discovered("c", "127.0.0.4", 0, 8000), "fallback"))

	t.Run("label only", func(t *testing.T) {
		h := newHarness(t, Config{ModelLabel: "model"}, nil)
		h.start()
		h.putPool(APIVersionV1, vllm, 8000)
		h.createPod(newPod("nolabel", "127.0.0.2"))
		poll.Until(t, "pod without model counted", func() bool { return h.metric(h.d.m.errors.WithLabelValues(errPod)) == 1 })
		h.createPod(newPod("labelled", "127.0.0.3", withLabels("app", "vllm", "model", "llama")))
		w := discovered("labelled", "127.0.0.3", 0, 8000)
		w.model = "llama"
		h.expect("only the labelled pod", w)
		if got := h.metric(h.d.m.errors.WithLabelValues(errPod)); got != 1 {
			t.Errorf("pod errors = %v, want 1 (counted once, not per reconcile)", got)
		}
	})
}

func TestEndpointsFromAnnotationsAndTemplates(t *testing.T) {
	h := newHarness(t, Config{EventsTemplate: "tcp://{podIP}:{6000+rank}", ReplayTemplate: "tcp://{podIP}:{7000+rank}", Topic: "kv-events"}, nil)
	h.start()
	h.putPool(APIVersionV1, vllm, 8000, 8001)
	h.createPod(newPod("tmpl", "127.0.0.2"))
	h.createPod(newPod("ann", "127.0.0.3",
		withAnnotation(AnnotationEvents, "tcp://{podIP}:5000, tcp://127.0.0.9:{port}"),
		withAnnotation(AnnotationReplay, "")))
	h.createPod(newPod("off", "127.0.0.4", withAnnotation(AnnotationEvents, "")))
	h.createPod(newPod("bad", "127.0.0.5", withAnnotation(AnnotationEvents, "tcp://{podIP}:1,tcp://{podIP}:2,tcp://{podIP}:3")))
	with := func(w want, events, replay string) want { w.events, w.replay = events, replay; return w }
	good := []want{
		with(discovered("tmpl", "127.0.0.2", 0, 8000), "tcp://127.0.0.2:6000", "tcp://127.0.0.2:7000"),
		with(discovered("tmpl", "127.0.0.2", 1, 8001), "tcp://127.0.0.2:6001", "tcp://127.0.0.2:7001"),
		with(discovered("ann", "127.0.0.3", 0, 8000), "tcp://127.0.0.3:5000", ""),
		with(discovered("ann", "127.0.0.3", 1, 8001), "tcp://127.0.0.9:8001", ""),
		with(discovered("off", "127.0.0.4", 0, 8000), "", ""),
		with(discovered("off", "127.0.0.4", 1, 8001), "", ""),
	}
	h.expect("endpoints, bad pod skipped", good...)
	for _, w := range h.cat.Workers("", "") {
		for rank, p := range w.Events {
			if p.Topic != "kv-events" {
				t.Errorf("worker %d rank %d subscribes to topic %q, want the configured kv-events", w.ID, rank, p.Topic)
			}
		}
	}
	poll.Until(t, "bad pod counted", func() bool { return h.metric(h.d.m.errors.WithLabelValues(errPod)) == 1 })

	h.updatePod("bad", withAnnotation(AnnotationEvents, "ipc:///run/kv-{rank}"), withAnnotation(AnnotationReplay, "tcp://{podIP}:{9000+rank}"))
	h.expect("bad pod fixed", append(good,
		with(discovered("bad", "127.0.0.5", 0, 8000), "ipc:///run/kv-0", "tcp://127.0.0.5:9000"),
		with(discovered("bad", "127.0.0.5", 1, 8001), "ipc:///run/kv-1", "tcp://127.0.0.5:9001"))...)
}

func TestNoEvents(t *testing.T) {
	h := newHarness(t, Config{EventsTemplate: NoEvents, ReplayTemplate: "tcp://{podIP}:1"}, nil)
	h.start()
	h.putPool(APIVersionV1, vllm, 8000)
	h.createPod(newPod("a", "127.0.0.2"))
	w := discovered("a", "127.0.0.2", 0, 8000)
	w.events = ""
	h.expect("worker without events", w)
	// Active at once: no listener to wait for.
	if ws := h.cat.Workers(testModel, ""); len(ws) != 1 || ws[0].Status != catalog.StatusActive {
		t.Errorf("workers = %+v, want one active", ws)
	}
}

// TestListenerFollowsPod checks that a discovered pod's KV event listener
// connects to its (real) publisher, and goes with the pod.
func TestListenerFollowsPod(t *testing.T) {
	pub := enginetest.Start(t, engine.Config{})
	_, port, err := net.SplitHostPort(strings.TrimPrefix(pub.Endpoint(), "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, Config{EventsTemplate: "tcp://{podIP}:{" + port + "+rank}"}, nil)
	h.start()
	h.putPool(APIVersionV1, vllm, 8000)
	h.createPod(newPod("engine", "127.0.0.1"))
	id := WorkerID(testNS, "engine", 0)
	poll.Until(t, "listener active", func() bool {
		ws := h.cat.Workers(testModel, "")
		return len(ws) == 1 && ws[0].ID == id && ws[0].Status == catalog.StatusActive &&
			ws[0].Listeners[0].Endpoint == pub.Endpoint() && ws[0].Listeners[0].Status == catalog.StatusActive
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pub.WaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}

	h.deletePod("engine")
	h.expect("worker gone")
	for _, l := range h.ing.Listeners() {
		if l.Worker == id {
			t.Errorf("listener of the deleted pod's worker remains: %+v", l)
		}
	}
}

// flaky fails the first fails PutWorker calls.
type flaky struct {
	*catalog.Catalog
	fails atomic.Int32
}

func (f *flaky) PutWorker(s catalog.WorkerSpec) error {
	if f.fails.Add(-1) >= 0 {
		return fmt.Errorf("%w: injected", scheduler.ErrUnavailable)
	}
	return f.Catalog.PutWorker(s)
}

func TestFailedRegistrationRetried(t *testing.T) {
	f := &flaky{}
	f.fails.Store(3)
	h := newHarness(t, Config{}, func(c *catalog.Catalog) Catalog { f.Catalog = c; return f })
	h.start()
	h.putPool(APIVersionV1, vllm, 8000)
	h.createPod(newPod("a", "127.0.0.2"))
	h.expect("registered after retries", discovered("a", "127.0.0.2", 0, 8000))
	if got := h.metric(h.d.m.changes.WithLabelValues(opPut, outcomeError)); got != 3 {
		t.Errorf("failed registrations = %v, want 3", got)
	}
}

func TestBlockSizeConflict(t *testing.T) {
	// Another worker of the model holds its index at another block size:
	// discovery's registrations fail, are counted, and change nothing.
	h := newHarness(t, Config{}, nil)
	other := catalog.WorkerSpec{
		WorkerKey: catalog.WorkerKey{Key: indexer.Key{Model: testModel, Tenant: indexer.DefaultTenant}, ID: 1},
		BlockSize: 2 * testBS, Endpoint: "127.0.0.99:8000", DPStart: 0, DPSize: 1, Source: catalog.SourceConfig,
	}
	if err := h.cat.PutWorker(other); err != nil {
		t.Fatal(err)
	}
	h.start()
	h.putPool(APIVersionV1, vllm, 8000)
	h.createPod(newPod("a", "127.0.0.2"))
	poll.Until(t, "failures counted and retried", func() bool {
		return h.metric(h.d.m.changes.WithLabelValues(opPut, outcomeError)) >= 2
	})
	ws := h.cat.Workers("", "")
	if len(ws) != 1 || ws[0].ID != 1 {
		t.Errorf("workers = %+v, want only the static one", ws)
	}
}

func TestUsable(t *testing.T) {
	now := metav1.Now()
	tests := []struct {
		name string
		pod  *corev1.Pod
		ok   bool
		why  string
	}{
		{"ready", newPod("p", "10.0.0.1"), true, ""},
		{"not ready", newPod("p", "10.0.0.1", ready(false)), false, "not ready"},
		{"no ready condition", newPod("p", "10.0.0.1", func(p *corev1.Pod) {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.ContainersReady, Status: corev1.ConditionTrue}}
		}), false, "not ready"},
		{"unknown", newPod("p", "10.0.0.1", func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionUnknown }), false, "not ready"},
		{"no IP", newPod("p", ""), false, "no IP"},
		{"terminating", newPod("p", "10.0.0.1", func(p *corev1.Pod) { p.DeletionTimestamp = &now }), false, "terminating"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ok, why := usable(tc.pod)
			if ok != tc.ok || !strings.Contains(why, tc.why) || (tc.ok && why != "") {
				t.Errorf("usable = %v, %q; want %v, %q", ok, why, tc.ok, tc.why)
			}
		})
	}
}

func TestParsePool(t *testing.T) {
	v1 := func(mut func(spec map[string]any)) *unstructured.Unstructured {
		u := inferencePool(APIVersionV1, vllm, 8000, 8001)
		if mut != nil {
			mut(u.Object["spec"].(map[string]any))
		}
		return u
	}
	alpha := func(mut func(spec map[string]any)) *unstructured.Unstructured {
		u := inferencePool(APIVersionV1Alpha2, vllm, 8000)
		if mut != nil {
			mut(u.Object["spec"].(map[string]any))
		}
		return u
	}
	tests := []struct {
		name       string
		apiVersion string
		u          *unstructured.Unstructured
		ports      []int32
		err        string
	}{
		{"v1", APIVersionV1, v1(nil), []int32{8000, 8001}, ""},
		{"v1 float port", APIVersionV1, v1(func(s map[string]any) { s["targetPorts"] = []any{map[string]any{"number": 8000.0}} }), []int32{8000}, ""},
		{"v1alpha2", APIVersionV1Alpha2, alpha(nil), []int32{8000}, ""},
		{"v1 empty selector", APIVersionV1, v1(func(s map[string]any) { s["selector"] = map[string]any{} }), nil, "selector is empty"},
		{"v1 no selector", APIVersionV1, v1(func(s map[string]any) { delete(s, "selector") }), nil, "selector is empty"},
		{"v1 bad label value", APIVersionV1, v1(func(s map[string]any) {
			s["selector"] = map[string]any{"matchLabels": map[string]any{"app": "no spaces"}}
		}), nil, "pod selector"},
		{"v1 selector not strings", APIVersionV1, v1(func(s map[string]any) {
			s["selector"] = map[string]any{"matchLabels": map[string]any{"app": int64(1)}}
		}), nil, "matchLabels"},
		{"v1 no ports", APIVersionV1, v1(func(s map[string]any) { delete(s, "targetPorts") }), nil, "no target port"},
		{"v1 port zero", APIVersionV1, v1(func(s map[string]any) { s["targetPorts"] = []any{map[string]any{"number": int64(0)}} }), nil, "between 1 and 65535"},
		{"v1 port too big", APIVersionV1, v1(func(s map[string]any) { s["targetPorts"] = []any{map[string]any{"number": int64(70000)}} }), nil, "between 1 and 65535"},
		{"v1 port fraction", APIVersionV1, v1(func(s map[string]any) { s["targetPorts"] = []any{map[string]any{"number": 80.5}} }), nil, "not an integer"},
		{"v1 port string", APIVersionV1, v1(func(s map[string]any) { s["targetPorts"] = []any{map[string]any{"number": "80"}} }), nil, "not a number"},
		{"v1 port missing", APIVersionV1, v1(func(s map[string]any) { s["targetPorts"] = []any{map[string]any{}} }), nil, "missing"},
		{"v1 duplicate port", APIVersionV1, v1(func(s map[string]any) {
			s["targetPorts"] = []any{map[string]any{"number": int64(1)}, map[string]any{"number": int64(1)}}
		}), nil, "twice"},
		{"v1alpha2 no port", APIVersionV1Alpha2, alpha(func(s map[string]any) { delete(s, "targetPortNumber") }), nil, "targetPortNumber: missing"},
		{"v1alpha2 v1-shaped selector", APIVersionV1Alpha2, alpha(func(s map[string]any) {
			s["selector"] = map[string]any{"matchLabels": map[string]any{"app": "vllm"}}
		}), nil, "spec.selector"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := parsePool(tc.apiVersion, tc.u)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(p.ports, tc.ports) || p.selector["app"] != "vllm" || len(p.selector) != 1 || p.picker != "kvgate" {
				t.Errorf("pool = %+v, want ports %v, selector app=vllm, picker kvgate", p, tc.ports)
			}
		})
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	good := Config{PoolName: testPool, PoolNamespace: testNS, Model: testModel, BlockSize: testBS}
	tests := []struct {
		name string
		mut  func(*Config)
		err  string
	}{
		{"no pool name", func(c *Config) { c.PoolName = "" }, "pool name is required"},
		{"bad pool name", func(c *Config) { c.PoolName = "Pool_1" }, "pool name"},
		{"no namespace", func(c *Config) { c.PoolNamespace = "" }, "namespace is required"},
		{"bad namespace", func(c *Config) { c.PoolNamespace = "a.b" }, "namespace"},
		{"bad api version", func(c *Config) { c.APIVersion = "v2" }, "API version"},
		{"no model", func(c *Config) { c.Model = "" }, "model"},
		{"bad model label", func(c *Config) { c.ModelLabel = "bad label" }, "model label"},
		{"no block size", func(c *Config) { c.BlockSize = 0 }, "block size"},
		{"block size over the bound", func(c *Config) { c.BlockSize = indexer.MaxBlockSize + 1 }, "between 1 and 65536"},
		{"bad events template", func(c *Config) { c.EventsTemplate = "tcp://{ip}:5557" }, "kv events template"},
		{"events template not an endpoint", func(c *Config) { c.EventsTemplate = "{podIP}:5557" }, "kv events template"},
		{"bad replay template", func(c *Config) { c.ReplayTemplate = "tcp://{podIP}:{x+rank}" }, "kv replay template"},
	}
	kube, dyn := kfake.NewClientset(), dfake.NewSimpleDynamicClient(runtime.NewScheme())
	cat := &flaky{}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good
			tc.mut(&cfg)
			reg := prometheus.NewRegistry()
			_, err := New(kube, dyn, cat, cfg, reg)
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("error = %v, want one containing %q", err, tc.err)
			}
			if mfs, _ := reg.Gather(); len(mfs) != 0 {
				t.Errorf("a rejected config registered %d metrics", len(mfs))
			}
		})
	}
	t.Run("good", func(t *testing.T) {
		for _, v := range []string{"", "auto", "v1", "v1alpha2", APIVersionV1, APIVersionV1Alpha2} {
			cfg := good
			cfg.APIVersion = v
			if _, err := New(kube, dyn, cat, cfg, nil); err != nil {
				t.Errorf("APIVersion %q: %v", v, err)
			}
		}
		cfg := good
		cfg.Model, cfg.ModelLabel = "", "app.kubernetes.io/model"
		d, err := New(kube, dyn, cat, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		if d.cfg.Tenant != indexer.DefaultTenant || d.events == nil || d.events.raw != DefaultEventsTemplate || d.replay != nil {
			t.Errorf("defaults: tenant %q, events %v, replay %v", d.cfg.Tenant, d.events, d.replay)
		}
	})
	t.Run("metrics registered twice", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		if _, err := New(kube, dyn, cat, good, reg); err != nil {
			t.Fatal(err)
		}
		if _, err := New(kube, dyn, cat, good, reg); err == nil {
			t.Fatal("a second Discovery on the same registry was accepted")
		}
	})
	t.Run("run twice", func(t *testing.T) {
		d, err := New(kube, dyn, cat, good, nil)
		if err != nil {
			t.Fatal(err)
		}
		d.started.Store(true)
		if err := d.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "more than once") {
			t.Errorf("second Run = %v", err)
		}
	})
}

func TestClients(t *testing.T) {
	if os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		if _, _, err := Clients(""); err == nil || !strings.Contains(err.Error(), "in-cluster") {
			t.Errorf("in-cluster config outside a cluster: %v", err)
		}
	}
	if _, _, err := Clients(t.TempDir() + "/missing"); err == nil {
		t.Error("a missing kubeconfig was accepted")
	}
	path := t.TempDir() + "/kubeconfig"
	cfg := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	kube, dyn, err := Clients(path)
	if err != nil || kube == nil || dyn == nil {
		t.Fatalf("Clients = %v, %v, %v", kube, dyn, err)
	}
}
