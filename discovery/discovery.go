package discovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kvgate/kvgate/indexer"
	"github.com/kvgate/kvgate/scheduler"
	"github.com/kvgate/kvgate/scheduler/catalog"
)

// Source is the catalog source of the workers Discovery registers.
const Source = "kubernetes"

// InferencePool API versions (Config.APIVersion also takes "v1" and
// "v1alpha2" for short).
const (
	APIVersionAuto     = "auto"
	APIVersionV1       = "inference.networking.k8s.io/v1"
	APIVersionV1Alpha2 = "inference.networking.x-k8s.io/v1alpha2"
)

// poolResource is the InferencePool resource name in every API version.
const poolResource = "inferencepools"

// poolGVR returns the InferencePool resource of apiVersion, one of the
// APIVersion constants.
func poolGVR(apiVersion string) schema.GroupVersionResource {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		panic(fmt.Sprintf("discovery: bad API version constant %q: %v", apiVersion, err))
	}
	return gv.WithResource(poolResource)
}

// Retry delays of failed catalog changes: the first, doubling to the last.
const (
	minRetry = time.Second
	maxRetry = time.Minute
)

// Config configures a Discovery. Its fields match `kvgate serve`'s flags
// (--pool-name, --pool-namespace, --pool-api-version, --pod-model-label,
// --kv-events-template, --kv-replay-template).
type Config struct {
	// PoolName and PoolNamespace name the InferencePool to follow. Required.
	PoolName, PoolNamespace string
	// APIVersion is the InferencePool API: "auto" (or ""): both, the v1
	// pool winning when it exists in both; "v1" / APIVersionV1 or
	// "v1alpha2" / APIVersionV1Alpha2: that one only.
	APIVersion string
	// Model is the model name of the pool's workers; ModelLabel, if set, a
	// pod label whose value, when present and not empty, overrides it.
	// At least one is required.
	Model, ModelLabel string
	// Tenant of the workers; default "default".
	Tenant string
	// BlockSize is the workers' KV block size in tokens. Required.
	BlockSize int
	// EventsTemplate is the KV event endpoint of a pod's rank, default
	// DefaultEventsTemplate; NoEvents registers workers without. Pods
	// override it with AnnotationEvents.
	EventsTemplate string
	// ReplayTemplate is the replay endpoint of a pod's rank, "" for none.
	// Pods override it with AnnotationReplay.
	ReplayTemplate string
	// Topic is the ZMQ topic prefix subscribed to ("" for every topic).
	Topic  string
	Logger *slog.Logger
}

// Catalog is what Discovery needs of the worker catalog
// (*catalog.Catalog implements it).
type Catalog interface {
	PutWorker(catalog.WorkerSpec) error
	Unregister(model string, tenant *string, id uint64, rank *uint32) (int, error)
}

// Discovery follows one InferencePool and keeps the catalog's workers in
// step with its Ready pods. See the package documentation.
type Discovery struct {
	kube     kubernetes.Interface
	dyn      dynamic.Interface
	cat      Catalog
	cfg      Config
	log      *slog.Logger
	versions []string  // InferencePool API versions watched, preferred first
	events   *template // nil: no KV events
	replay   *template // nil: no replay
	m        *metrics
	minRetry time.Duration // first retry delay of a failed change
	started  atomic.Bool
}

// New checks cfg and returns a Discovery that Run starts. reg, if not nil,
// receives the kvgate_discovery_* metrics. A bad configuration is an error
// that registers nothing.
func New(kube kubernetes.Interface, dyn dynamic.Interface, cat Catalog, cfg Config, reg prometheus.Registerer) (*Discovery, error) {
	if kube == nil || dyn == nil || cat == nil {
		return nil, errors.New("discovery: kubernetes clients and catalog are required")
	}
	if cfg.PoolName == "" {
		return nil, errors.New("discovery: pool name is required")
	}
	if errs := validation.IsDNS1123Subdomain(cfg.PoolName); len(errs) > 0 {
		return nil, fmt.Errorf("discovery: pool name %q: %s", cfg.PoolName, errs[0])
	}
	if cfg.PoolNamespace == "" {
		return nil, errors.New("discovery: pool namespace is required")
	}
	if errs := validation.IsDNS1123Label(cfg.PoolNamespace); len(errs) > 0 {
		return nil, fmt.Errorf("discovery: pool namespace %q: %s", cfg.PoolNamespace, errs[0])
	}
	var versions []string
	switch cfg.APIVersion {
	case "", APIVersionAuto:
		versions = []string{APIVersionV1, APIVersionV1Alpha2}
	case "v1", APIVersionV1:
		versions = []string{APIVersionV1}
	case "v1alpha2", APIVersionV1Alpha2:
		versions = []string{APIVersionV1Alpha2}
	default:
		return nil, fmt.Errorf("discovery: pool API version %q: want auto, v1 (%s) or v1alpha2 (%s)", cfg.APIVersion, APIVersionV1, APIVersionV1Alpha2)
	}
	if cfg.Model == "" && cfg.ModelLabel == "" {
		return nil, errors.New("discovery: a model name or a pod model label is required")
	}
	if cfg.ModelLabel != "" {
		if errs := validation.IsQualifiedName(cfg.ModelLabel); len(errs) > 0 {
			return nil, fmt.Errorf("discovery: pod model label %q: %s", cfg.ModelLabel, errs[0])
		}
	}
	if cfg.BlockSize < 1 || cfg.BlockSize > indexer.MaxBlockSize {
		return nil, fmt.Errorf("discovery: block size must be between 1 and %d, not %d", indexer.MaxBlockSize, cfg.BlockSize)
	}
	if cfg.Tenant == "" {
		cfg.Tenant = indexer.DefaultTenant
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	d := &Discovery{kube: kube, dyn: dyn, cat: cat, cfg: cfg, log: cfg.Logger, versions: versions, minRetry: minRetry}
	switch cfg.EventsTemplate {
	case NoEvents:
	case "":
		cfg.EventsTemplate = DefaultEventsTemplate
		fallthrough
	default:
		t, err := parseConfigTemplate(cfg.EventsTemplate)
		if err != nil {
			return nil, fmt.Errorf("discovery: kv events template: %w", err)
		}
		d.events = &t
	}
	if cfg.ReplayTemplate != "" {
		t, err := parseConfigTemplate(cfg.ReplayTemplate)
		if err != nil {
			return nil, fmt.Errorf("discovery: kv replay template: %w", err)
		}
		d.replay = &t
	}
	d.cfg = cfg
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("discovery: metrics: %w", err)
	}
	d.m = m
	return d, nil
}

// Clients returns Kubernetes clients from the kubeconfig file at path, or
// the in-cluster configuration (service account) when path is "".
func Clients(kubeconfig string) (kubernetes.Interface, dynamic.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, nil, fmt.Errorf("in-cluster kubernetes config (outside a cluster, give a kubeconfig): %w", err)
		}
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
	}
	cfg.UserAgent = "kvgate"
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes dynamic client: %w", err)
	}
	return kube, dyn, nil
}

// Run follows the pool until ctx ends, then stops every watch and returns
// nil. The workers it registered stay in the catalog (see the package
// documentation). Run may be called once.
func (d *Discovery) Run(ctx context.Context) error {
	if !d.started.CompareAndSwap(false, true) {
		return errors.New("discovery: Run called more than once")
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &runner{
		d: d, ctx: ctx, dirty: make(chan struct{}, 1),
		tracked: make(map[uint64]worker), failed: make(map[uint64]worker), badPods: make(map[string]string),
	}
	defer func() {
		cancel() // informers stop before their factories shut down
		r.stopPods()
		for _, s := range r.pools {
			s.factory.Shutdown()
		}
	}()
	if err := r.startPools(); err != nil {
		return err
	}
	d.log.Info("discovery: following InferencePool", "pool", d.cfg.PoolName, "namespace", d.cfg.PoolNamespace,
		"api_versions", d.versions, "model", d.cfg.Model, "model_label", d.cfg.ModelLabel, "tenant", d.cfg.Tenant)
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	var retryC <-chan time.Time
	backoff := d.minRetry
	for {
		select {
		case <-ctx.Done():
			d.log.Info("discovery: stopped; its workers stay registered", "pool", d.cfg.PoolName, "workers", len(r.tracked))
			return nil
		case <-r.dirty:
		case <-retryC:
			retryC, r.retryDue = nil, true
		}
		r.reconcile()
		r.retryDue = false
		switch {
		case r.failures == 0:
			retry.Stop()
			retryC, backoff = nil, d.minRetry
		case retryC == nil:
			retry.Reset(backoff)
			retryC, backoff = retry.C, min(2*backoff, maxRetry)
		}
	}
}

// runner is the state of one Run; only Run's goroutine touches it, but
// for poke, which informer handlers call.
type runner struct {
	d     *Discovery
	ctx   context.Context // Run's, ends when it returns
	dirty chan struct{}   // something changed: reconcile

	pools    []poolSource
	pods     *podWatch
	tracked  map[uint64]worker // registered by this Run, as registered
	failed   map[uint64]worker // wanted, but PutWorker failed, as tried
	badPods  map[string]string // pods whose workers cannot be built: why
	lastPool string            // the pool as last seen, for change logs
	retryDue bool              // retry failed registrations now
	failures int               // failed changes of the last reconcile
}

func (r *runner) poke() {
	select {
	case r.dirty <- struct{}{}:
	default:
	}
}

func (r *runner) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { r.poke() },
		UpdateFunc: func(any, any) { r.poke() },
		DeleteFunc: func(any) { r.poke() },
	}
}

// watchError returns the informers' watch error handler for what: it
// logs and counts instead of client-go's klog output. In auto mode a
// missing API version is expected, and logged at debug level only.
func (r *runner) watchError(what string) cache.WatchErrorHandlerWithContext {
	return func(ctx context.Context, _ *cache.Reflector, err error) {
		if ctx.Err() != nil {
			return
		}
		if apierrors.IsNotFound(err) && len(r.d.versions) > 1 {
			r.d.log.Debug("discovery: watch failed (API version not served?)", "what", what, "err", err)
			return
		}
		r.d.m.errors.WithLabelValues(errWatch).Inc()
		r.d.log.Warn("discovery: watch failed; retrying", "what", what, "namespace", r.d.cfg.PoolNamespace, "err", err)
	}
}

// poolSource is the watch of the pool in one API version.
type poolSource struct {
	apiVersion string
	factory    dynamicinformer.DynamicSharedInformerFactory
	inf        cache.SharedIndexInformer
}

func (r *runner) startPools() error {
	cfg := r.d.cfg
	byName := fields.OneTermEqualSelector("metadata.name", cfg.PoolName).String()
	for _, v := range r.d.versions {
		f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(r.d.dyn, 0, cfg.PoolNamespace,
			func(o *metav1.ListOptions) { o.FieldSelector = byName })
		inf := f.ForResource(poolGVR(v)).Informer()
		if err := inf.SetWatchErrorHandlerWithContext(r.watchError(poolResource + "." + v)); err != nil {
			return fmt.Errorf("discovery: pool watch %s: %w", v, err)
		}
		if _, err := inf.AddEventHandler(r.handler()); err != nil {
			return fmt.Errorf("discovery: pool watch %s: %w", v, err)
		}
		r.pools = append(r.pools, poolSource{apiVersion: v, factory: f, inf: inf})
		f.Start(r.ctx.Done())
	}
	return nil
}

// pool is an InferencePool's spec, as far as discovery needs it.
type pool struct {
	apiVersion string
	selector   map[string]string
	ports      []int32 // rank i's target port is ports[i]
	picker     string  // its endpoint picker's name, for logs
}

func (p pool) String() string {
	return fmt.Sprintf("%s selector=%s ports=%v picker=%q", p.apiVersion, labels.Set(p.selector), p.ports, p.picker)
}

// currentPool returns the pool from the first API version that has it.
func (r *runner) currentPool() (pool, bool, error) {
	key := r.d.cfg.PoolNamespace + "/" + r.d.cfg.PoolName
	for _, s := range r.pools {
		obj, ok, err := s.inf.GetStore().GetByKey(key)
		if err != nil || !ok {
			continue
		}
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return pool{}, true, fmt.Errorf("pool %s is a %T", key, obj)
		}
		p, err := parsePool(s.apiVersion, u)
		return p, true, err
	}
	return pool{}, false, nil
}

// parsePool reads the selector and target ports of an InferencePool of
// apiVersion.
func parsePool(apiVersion string, u *unstructured.Unstructured) (pool, error) {
	p := pool{apiVersion: apiVersion}
	var err error
	switch apiVersion {
	case APIVersionV1:
		if p.selector, _, err = unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels"); err != nil {
			return p, fmt.Errorf("spec.selector.matchLabels: %w", err)
		}
		items, _, err := unstructured.NestedSlice(u.Object, "spec", "targetPorts")
		if err != nil {
			return p, fmt.Errorf("spec.targetPorts: %w", err)
		}
		for i, item := range items {
			m, _ := item.(map[string]any)
			n, err := portNumber(m["number"])
			if err != nil {
				return p, fmt.Errorf("spec.targetPorts[%d].number: %w", i, err)
			}
			p.ports = append(p.ports, n)
		}
		p.picker, _, _ = unstructured.NestedString(u.Object, "spec", "endpointPickerRef", "name")
	case APIVersionV1Alpha2:
		if p.selector, _, err = unstructured.NestedStringMap(u.Object, "spec", "selector"); err != nil {
			return p, fmt.Errorf("spec.selector: %w", err)
		}
		v, _, _ := unstructured.NestedFieldNoCopy(u.Object, "spec", "targetPortNumber")
		n, err := portNumber(v)
		if err != nil {
			return p, fmt.Errorf("spec.targetPortNumber: %w", err)
		}
		p.ports = []int32{n}
		p.picker, _, _ = unstructured.NestedString(u.Object, "spec", "extensionRef", "name")
	default:
		return p, fmt.Errorf("unknown API version %q", apiVersion)
	}
	if len(p.selector) == 0 {
		return p, errors.New("the pod selector is empty")
	}
	if _, err := labels.ValidatedSelectorFromSet(p.selector); err != nil {
		return p, fmt.Errorf("pod selector: %w", err)
	}
	if len(p.ports) == 0 {
		return p, errors.New("no target port")
	}
	if len(p.ports) > catalog.MaxDPSize {
		return p, fmt.Errorf("%d target ports, more than %d", len(p.ports), catalog.MaxDPSize)
	}
	for i, n := range p.ports {
		if slices.Index(p.ports, n) != i {
			return p, fmt.Errorf("target port %d is listed twice", n)
		}
	}
	return p, nil
}

// portNumber reads a port number from unstructured JSON.
func portNumber(v any) (int32, error) {
	var n int64
	switch x := v.(type) {
	case int64:
		n = x
	case int32:
		n = int64(x)
	case int:
		n = int64(x)
	case float64:
		if x != math.Trunc(x) {
			return 0, fmt.Errorf("%v is not an integer", x)
		}
		n = int64(x)
	case nil:
		return 0, errors.New("missing")
	default:
		return 0, fmt.Errorf("%v (%T) is not a number", v, v)
	}
	if n < 1 || n > 65535 {
		return 0, fmt.Errorf("%d is not between 1 and 65535", n)
	}
	return int32(n), nil
}

// podWatch is the informer of the pods matching one selector.
type podWatch struct {
	selector string
	factory  informers.SharedInformerFactory
	inf      cache.SharedIndexInformer
	cancel   context.CancelFunc
	wg       sync.WaitGroup // the goroutine waiting for the first sync
}

// startPods starts watching the pods of the pool's namespace that match
// selector; reconcile runs again once their list is complete.
func (r *runner) startPods(selector string) error {
	ctx, cancel := context.WithCancel(r.ctx)
	f := informers.NewSharedInformerFactoryWithOptions(r.d.kube, 0, informers.WithNamespace(r.d.cfg.PoolNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	inf := f.Core().V1().Pods().Informer()
	err := errors.Join(
		inf.SetWatchErrorHandlerWithContext(r.watchError("pods")),
		inf.SetTransform(stripManagedFields))
	if err == nil {
		_, err = inf.AddEventHandler(r.handler())
	}
	if err != nil {
		cancel()
		return fmt.Errorf("discovery: pod watch: %w", err)
	}
	pw := &podWatch{selector: selector, factory: f, inf: inf, cancel: cancel}
	f.Start(ctx.Done())
	pw.wg.Go(func() {
		if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			r.poke()
		}
	})
	r.pods = pw
	r.d.m.podWatches.Inc()
	r.d.log.Info("discovery: watching pods", "namespace", r.d.cfg.PoolNamespace, "selector", selector)
	return nil
}

// stopPods stops the pod watch, if any, and waits for its goroutines.
func (r *runner) stopPods() {
	if r.pods == nil {
		return
	}
	r.pods.cancel()
	r.pods.factory.Shutdown()
	r.pods.wg.Wait()
	r.pods = nil
}

// stripManagedFields drops what discovery never reads, to save memory.
func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// usable reports whether pod may receive requests: Ready, not terminating
// and with an IP; when not, why.
func usable(pod *corev1.Pod) (bool, string) {
	switch {
	case pod.DeletionTimestamp != nil:
		return false, "pod is terminating"
	case pod.Status.PodIP == "":
		return false, "pod has no IP"
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			if c.Status == corev1.ConditionTrue {
				return true, ""
			}
			return false, "pod is not ready"
		}
	}
	return false, "pod is not ready"
}

// worker is a catalog worker of one rank of a pod.
type worker struct {
	spec catalog.WorkerSpec
	pod  string // pod name
	name string // <pod>-rank-<i>
}

func sameSpec(a, b catalog.WorkerSpec) bool {
	return a.WorkerKey == b.WorkerKey && a.BlockSize == b.BlockSize && a.Endpoint == b.Endpoint &&
		a.DPStart == b.DPStart && a.DPSize == b.DPSize && maps.Equal(a.Events, b.Events) &&
		a.Replay == b.Replay && a.Source == b.Source
}

// podWorkers returns the workers of a usable pod of p, one per target port.
func (r *runner) podWorkers(p pool, pod *corev1.Pod) ([]worker, error) {
	cfg := r.d.cfg
	model := cfg.Model
	if v := pod.Labels[cfg.ModelLabel]; cfg.ModelLabel != "" && v != "" {
		model = v
	}
	if model == "" {
		return nil, fmt.Errorf("no model name: label %s is missing and no default model is configured", cfg.ModelLabel)
	}
	events, err := endpointSource(pod.Annotations, AnnotationEvents, r.d.events, len(p.ports))
	if err != nil {
		return nil, err
	}
	replay, err := endpointSource(pod.Annotations, AnnotationReplay, r.d.replay, len(p.ports))
	if err != nil {
		return nil, err
	}
	ip := pod.Status.PodIP
	ws := make([]worker, len(p.ports))
	for i, port := range p.ports {
		v := hostVars(ip, i, port)
		ev, err := events.forRank(v)
		if err != nil {
			return nil, fmt.Errorf("kv events endpoint of rank %d: %w", i, err)
		}
		rp, err := replay.forRank(v)
		if err != nil {
			return nil, fmt.Errorf("kv replay endpoint of rank %d: %w", i, err)
		}
		s := catalog.WorkerSpec{
			WorkerKey: catalog.WorkerKey{Key: indexer.Key{Model: model, Tenant: cfg.Tenant}, ID: WorkerID(pod.Namespace, pod.Name, i)},
			BlockSize: cfg.BlockSize,
			Endpoint:  net.JoinHostPort(ip, strconv.Itoa(int(port))),
			DPStart:   uint32(i),
			DPSize:    1,
			Source:    Source,
		}
		if ev != "" {
			s.Events = map[uint32]string{uint32(i): ev}
			s.Replay, s.Topic = rp, cfg.Topic
		}
		ws[i] = worker{spec: s, pod: pod.Name, name: workerName(pod.Name, i)}
	}
	return ws, nil
}

// reconcile makes the catalog's discovered workers match the pool and its
// pods as the informers see them now.
func (r *runner) reconcile() {
	p, found, err := r.currentPool()
	desc := "absent"
	switch {
	case err != nil:
		desc = "invalid: " + err.Error()
	case found:
		desc = p.String()
	}
	if desc != r.lastPool {
		r.lastPool = desc
		switch {
		case err != nil:
			r.d.m.errors.WithLabelValues(errPool).Inc()
			r.d.log.Error("discovery: InferencePool is invalid; its workers are removed", "pool", r.d.cfg.PoolName, "namespace", r.d.cfg.PoolNamespace, "err", err)
		case found:
			r.d.log.Info("discovery: InferencePool", "pool", r.d.cfg.PoolName, "namespace", r.d.cfg.PoolNamespace,
				"api_version", p.apiVersion, "selector", labels.Set(p.selector).String(), "target_ports", p.ports, "endpoint_picker", p.picker)
		default:
			r.d.log.Warn("discovery: InferencePool not found; no workers", "pool", r.d.cfg.PoolName, "namespace", r.d.cfg.PoolNamespace)
		}
	}
	if !found || err != nil {
		r.d.m.pool.Set(0)
		r.stopPods()
		clear(r.badPods)
		r.d.m.pods.WithLabelValues("ready").Set(0)
		r.d.m.pods.WithLabelValues("unready").Set(0)
		why := "pool not found"
		if err != nil {
			why = "pool invalid"
		}
		r.converge(nil, func(worker) string { return why })
		return
	}
	r.d.m.pool.Set(1)
	selector := labels.SelectorFromSet(p.selector)
	if r.pods == nil || r.pods.selector != selector.String() {
		r.stopPods()
		if err := r.startPods(selector.String()); err != nil {
			r.d.m.errors.WithLabelValues(errWatch).Inc()
			r.d.log.Error("discovery: cannot watch pods", "err", err)
			r.failures++
			return
		}
	}
	if !r.pods.inf.HasSynced() {
		return // the sync waiter pokes when the list is in
	}

	desired := make(map[uint64]worker)
	notUsable := make(map[string]string) // pod -> why it has no worker
	ready, unready := 0, 0
	bad := make(map[string]string)
	for _, obj := range r.pods.inf.GetStore().List() {
		pod, ok := obj.(*corev1.Pod)
		if !ok || pod.Namespace != r.d.cfg.PoolNamespace {
			continue
		}
		if !selector.Matches(labels.Set(pod.Labels)) {
			notUsable[pod.Name] = "pod no longer matches the pool's selector"
			continue
		}
		if ok, why := usable(pod); !ok {
			unready++
			notUsable[pod.Name] = why
			continue
		}
		ready++
		ws, err := r.podWorkers(p, pod)
		if err != nil {
			bad[pod.Name] = err.Error()
			notUsable[pod.Name] = "pod skipped: " + err.Error()
			continue
		}
		for _, w := range ws {
			desired[w.spec.ID] = w
		}
	}
	for _, name := range slices.Sorted(maps.Keys(bad)) {
		if r.badPods[name] != bad[name] {
			r.d.m.errors.WithLabelValues(errPod).Inc()
			r.d.log.Error("discovery: pod skipped", "pod", name, "namespace", r.d.cfg.PoolNamespace, "err", bad[name])
		}
	}
	r.badPods = bad
	r.d.m.pods.WithLabelValues("ready").Set(float64(ready))
	r.d.m.pods.WithLabelValues("unready").Set(float64(unready))
	served := make(map[string]bool) // pods with workers
	for _, w := range desired {
		served[w.pod] = true
	}
	r.converge(desired, func(w worker) string {
		if why, ok := notUsable[w.pod]; ok {
			return why
		}
		if d, ok := desired[w.spec.ID]; ok && d.spec.Key != w.spec.Key {
			return "model changed"
		}
		if served[w.pod] {
			return "target port removed"
		}
		return "pod deleted or no longer matches the pool's selector"
	})
}

// converge unregisters the tracked workers that are not desired (why
// says why) and registers the desired ones that are new or changed.
func (r *runner) converge(desired map[uint64]worker, why func(worker) string) {
	r.failures = 0
	byName := func(ws map[uint64]worker) []worker {
		return slices.SortedFunc(maps.Values(ws), func(a, b worker) int {
			return cmp.Compare(a.name, b.name)
		})
	}
	for _, w := range byName(r.tracked) {
		if d, ok := desired[w.spec.ID]; ok && d.spec.Key == w.spec.Key {
			continue
		}
		r.unregister(w, why(w))
	}
	for _, w := range byName(desired) {
		if t, ok := r.tracked[w.spec.ID]; ok && sameSpec(t.spec, w.spec) {
			delete(r.failed, w.spec.ID)
			continue
		}
		if f, ok := r.failed[w.spec.ID]; ok && sameSpec(f.spec, w.spec) && !r.retryDue {
			r.failures++ // still failing: keep the retry timer going
			continue
		}
		r.put(w)
	}
	maps.DeleteFunc(r.failed, func(id uint64, _ worker) bool {
		_, ok := desired[id]
		return !ok
	})
	r.d.m.workers.Set(float64(len(r.tracked)))
}

func (r *runner) put(w worker) {
	s := w.spec
	prev, had := r.tracked[s.ID]
	if err := r.d.cat.PutWorker(s); err != nil {
		r.failures++
		r.failed[s.ID] = w
		r.d.m.changes.WithLabelValues(opPut, outcomeError).Inc()
		r.d.log.Warn("discovery: cannot register worker; will retry", "worker", w.name, "id", s.ID, "pod", w.pod,
			"model", s.Model, "endpoint", s.Endpoint, "kv_events", s.Events[s.DPStart], "err", err)
		return
	}
	delete(r.failed, s.ID)
	r.tracked[s.ID] = w
	r.d.m.changes.WithLabelValues(opPut, outcomeOK).Inc()
	attrs := []any{"worker", w.name, "id", s.ID, "pod", w.pod, "model", s.Model, "tenant", s.Tenant,
		"endpoint", s.Endpoint, "rank", s.DPStart, "kv_events", s.Events[s.DPStart], "kv_replay", s.Replay}
	if had {
		r.d.log.Info("discovery: updated worker", append(attrs, "old_endpoint", prev.spec.Endpoint, "old_kv_events", prev.spec.Events[prev.spec.DPStart])...)
	} else {
		r.d.log.Info("discovery: registered worker", attrs...)
	}
}

func (r *runner) unregister(w worker, why string) {
	s := w.spec
	tenant := s.Tenant
	_, err := r.d.cat.Unregister(s.Model, &tenant, s.ID, nil)
	switch {
	case err == nil:
	case errors.Is(err, scheduler.ErrNotFound):
		r.d.log.Info("discovery: worker was already unregistered", "worker", w.name, "id", s.ID)
	case errors.Is(err, scheduler.ErrUnavailable):
		// Removed from the catalog, but dropping its blocks failed.
		r.d.m.changes.WithLabelValues(opUnregister, outcomeError).Inc()
		r.d.log.Warn("discovery: unregistered worker, but dropping its blocks failed", "worker", w.name, "id", s.ID, "err", err)
		delete(r.tracked, s.ID)
		return
	default:
		r.failures++
		r.d.m.changes.WithLabelValues(opUnregister, outcomeError).Inc()
		r.d.log.Warn("discovery: cannot unregister worker; will retry", "worker", w.name, "id", s.ID, "reason", why, "err", err)
		return
	}
	delete(r.tracked, s.ID)
	r.d.m.changes.WithLabelValues(opUnregister, outcomeOK).Inc()
	r.d.log.Info("discovery: unregistered worker", "worker", w.name, "id", s.ID, "pod", w.pod, "model", s.Model,
		"tenant", s.Tenant, "endpoint", s.Endpoint, "reason", why)
}

// Metric label values.
const (
	opPut, opUnregister     = "register", "unregister"
	outcomeOK, outcomeError = "ok", "error"
	errWatch, errPool       = "watch", "pool"
	errPod                  = "pod"
)

type metrics struct {
	pods       *prometheus.GaugeVec
	workers    prometheus.Gauge
	pool       prometheus.Gauge
	changes    *prometheus.CounterVec
	errors     *prometheus.CounterVec
	podWatches prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		pods: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvgate_discovery_pods",
			Help: "Pods matching the InferencePool's selector, by state (ready: Ready, not terminating, with an IP).",
		}, []string{"state"}),
		workers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvgate_discovery_workers",
			Help: "Catalog workers registered by Kubernetes discovery (one per pod and target port).",
		}),
		pool: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvgate_discovery_pool_found",
			Help: "1 when the InferencePool exists and is valid, else 0.",
		}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_discovery_changes_total",
			Help: "Catalog changes made by Kubernetes discovery, by operation (register, unregister) and outcome (ok, error).",
		}, []string{"op", "outcome"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_discovery_errors_total",
			Help: "Kubernetes discovery errors: watch (API list/watch failures), pool (invalid InferencePool), pod (pods skipped for a bad annotation or no model name).",
		}, []string{"kind"}),
		podWatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_discovery_pod_watch_starts_total",
			Help: "Pod watches started (the first, and one per change of the pool's selector).",
		}),
	}
	for _, s := range []string{"ready", "unready"} {
		m.pods.WithLabelValues(s)
	}
	for _, op := range []string{opPut, opUnregister} {
		for _, o := range []string{outcomeOK, outcomeError} {
			m.changes.WithLabelValues(op, o)
		}
	}
	for _, k := range []string{errWatch, errPool, errPod} {
		m.errors.WithLabelValues(k)
	}
	if reg == nil {
		return m, nil
	}
	cs := []prometheus.Collector{m.pods, m.workers, m.pool, m.changes, m.errors, m.podWatches}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return nil, err
		}
	}
	return m, nil
}
