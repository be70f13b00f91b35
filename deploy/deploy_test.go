package deploy

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tokenize"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// targets are the kustomizations users apply, and what each must produce.
func targets() []target {
	return []target{
		{Dir: "base", Namespace: "inference", KvgateKind: "Deployment", Replicas: 1, LogLevel: "info"},
		{Dir: "overlays/dev", Namespace: "kvgate-dev", KvgateKind: "Deployment", Replicas: 1, LogLevel: "debug"},
		{Dir: "overlays/envoy-gateway", Namespace: "inference", KvgateKind: "Deployment", Replicas: 1, LogLevel: "info",
			Gateway: true, LocalTokenizers: true},
		{Dir: "overlays/ha", Namespace: "inference", KvgateKind: "StatefulSet", Replicas: 2, LogLevel: "info",
			Gateway: true, LocalTokenizers: true},
	}
}

func targetByDir(t *testing.T, dir string) target {
	t.Helper()
	for _, tg := range targets() {
		if tg.Dir == dir {
			return tg
		}
	}
	t.Fatalf("no target %s", dir)
	return target{}
}

// serveFlags builds kvgate and returns the flags `kvgate serve --help`
// lists: the manifests may use no other.
func serveFlags(t *testing.T) map[string]bool {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kvgate")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "github.com/kvgate/kvgate")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build kvgate: %v\n%s", err, out)
	}
	out, err := exec.CommandContext(t.Context(), bin, "serve", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("kvgate serve --help: %v\n%s", err, out)
	}
	flags, err := parseHelpFlags(string(out))
	if err != nil {
		t.Fatal(err)
	}
	return flags
}

// helpFlag matches a flag line of cobra's help: "  -h, --help   ...".
var helpFlag = regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9][a-z0-9-]*)[ =]`)

func parseHelpFlags(help string) (map[string]bool, error) {
	flags := map[string]bool{}
	for _, m := range helpFlag.FindAllStringSubmatch(help, -1) {
		flags[m[1]] = true
	}
	// The flags every version of serve has; if these are missing the help
	// format changed and the check below would be meaningless.
	for _, f := range []string{"admin-addr", "ext-proc-addr", "models", "shutdown-timeout"} {
		if !flags[f] {
			return nil, fmt.Errorf("could not find --%s in `kvgate serve --help`:\n%s", f, help)
		}
	}
	return flags, nil
}

func TestParseHelpFlags(t *testing.T) {
	help := "Flags:\n      --admin-addr string   a\n  -h, --help   help\n      --ext-proc-addr string  b\n" +
		"      --models string  c\n      --shutdown-timeout duration   d (default 10s)\n  not --a-flag here\n"
	got, err := parseHelpFlags(help)
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 0, len(got))
	for k := range got {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	want := []string{"admin-addr", "ext-proc-addr", "help", "models", "shutdown-timeout"}
	if !slices.Equal(keys, want) {
		t.Errorf("flags %v, want %v", keys, want)
	}
	if _, err := parseHelpFlags("Flags:\n      --other string\n"); err == nil {
		t.Error("a help text without the known flags was accepted")
	}
}

// buildDocs runs kustomize on dir (relative to deploy/) and returns every
// resource of the output as YAML.
func buildDocs(dir string) ([][]byte, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var docs [][]byte
	for _, r := range m.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			return nil, fmt.Errorf("kustomize build %s: %s: %w", dir, r.CurId(), err)
		}
		docs = append(docs, y)
	}
	return docs, nil
}

// problems decodes a build's documents strictly, validates each object and
// cross-checks them all; it returns every problem found.
func problems(tg target, docs [][]byte, flags map[string]bool) []error {
	var errs []error
	var objs []object
	for i, d := range docs {
		o, err := decodeDoc(fmt.Sprintf("%s#%d", tg.Dir, i), d)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, validateObject(o)...)
		objs = append(objs, o)
	}
	return append(errs, checkBundle(objs, flags, tg)...)
}

// TestKustomizeBuilds builds the base and every overlay and checks the
// output, object by object and as a whole.
func TestKustomizeBuilds(t *testing.T) {
	flags := serveFlags(t)
	for _, tg := range targets() {
		t.Run(tg.Dir, func(t *testing.T) {
			docs, err := buildDocs(tg.Dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(docs) == 0 {
				t.Fatal("the build produced nothing")
			}
			for _, err := range problems(tg, docs, flags) {
				t.Error(err)
			}
		})
	}
}

// TestEveryOverlayIsTested: a new overlay must be added to targets().
func TestEveryOverlayIsTested(t *testing.T) {
	entries, err := os.ReadDir("overlays")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			targetByDir(t, "overlays/"+e.Name())
		}
	}
}

// fileRole is what a kustomization uses a YAML file for.
type fileRole string

const (
	roleResource  fileRole = "resource"
	rolePatch     fileRole = "patch"
	roleGenerator fileRole = "generator input"
)

// jsonPatchOp is one RFC 6902 operation.
type jsonPatchOp struct {
	Op    string          `json:"op"`
	Path  string          `json:"path"`
	Value json.RawMessage `json:"value,omitempty"`
	From  string          `json:"from,omitempty"`
}

// TestManifestFiles decodes every YAML file under deploy/ strictly, by the
// role its kustomization gives it: resources into their typed objects (and
// validated), strategic-merge patches into their typed objects, JSON
// patches into RFC 6902 operations, models.yaml with kvgate's own parser.
// Kustomization files themselves decode strictly into kustomize's type. A
// file no kustomization uses is an error.
func TestManifestFiles(t *testing.T) {
	var files []string
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string]fileRole{}
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			checkKustomization(t, f, roles)
		}
	}
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		t.Run(f, func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, err := range checkFile(f, roles[f], data) {
				t.Error(err)
			}
		})
	}
}

// checkKustomization decodes a kustomization strictly, checks that what it
// names exists, and records the role of each file it uses.
func checkKustomization(t *testing.T, file string, roles map[string]fileRole) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var k types.Kustomization
	if err := strictUnmarshal(data, &k); err != nil {
		t.Errorf("%s: %v", file, err)
		return
	}
	if k.Kind != types.KustomizationKind && k.Kind != types.ComponentKind {
		t.Errorf("%s: kind %q", file, k.Kind)
	}
	if len(k.PatchesStrategicMerge)+len(k.PatchesJson6902)+len(k.Bases)+len(k.CommonLabels)+len(k.Vars) > 0 {
		t.Errorf("%s: uses deprecated fields (patchesStrategicMerge, patchesJson6902, bases, commonLabels, vars)", file)
	}
	dir := filepath.Dir(file)
	use := func(rel string, role fileRole) {
		p := filepath.Join(dir, rel)
		st, err := os.Stat(p)
		switch {
		case err != nil:
			t.Errorf("%s: %v", file, err)
		case st.IsDir():
			if _, err := os.Stat(filepath.Join(p, "kustomization.yaml")); err != nil {
				t.Errorf("%s: %s has no kustomization.yaml", file, rel)
			}
		case roles[p] != "" && roles[p] != role:
			t.Errorf("%s: %s is used both as %s and as %s", file, p, roles[p], role)
		default:
			roles[p] = role
		}
	}
	for _, r := range k.Resources {
		use(r, roleResource)
	}
	for _, c := range k.Components {
		use(c, roleResource)
	}
	for _, p := range k.Patches {
		if p.Path == "" {
			t.Errorf("%s: keep patches in files (path:), not inline", file)
			continue
		}
		use(p.Path, rolePatch)
	}
	for _, g := range k.ConfigMapGenerator {
		for _, src := range g.FileSources {
			_, f, ok := strings.Cut(src, "=")
			if !ok {
				f = src
			}
			use(f, roleGenerator)
		}
	}
}

// checkFile decodes one file by its role.
func checkFile(file string, role fileRole, data []byte) []error {
	switch role {
	case roleResource:
		objs, err := decodeAll(file, data)
		if err != nil {
			return []error{err}
		}
		if len(objs) == 0 {
			return []error{fmt.Errorf("%s: no object", file)}
		}
		var errs []error
		for _, o := range objs {
			errs = append(errs, validateObject(o)...)
		}
		return errs
	case rolePatch:
		var probe any
		if err := yaml.Unmarshal(data, &probe); err != nil {
			return []error{fmt.Errorf("%s: %w", file, err)}
		}
		if _, isList := probe.([]any); !isList {
			// A strategic-merge patch: a partial object, decoded as strictly.
			_, err := decodeAll(file, data)
			if err != nil {
				return []error{err}
			}
			return nil
		}
		var ops []jsonPatchOp
		if err := strictUnmarshal(data, &ops); err != nil {
			return []error{fmt.Errorf("%s: JSON patch: %w", file, err)}
		}
		var errs []error
		for i, op := range ops {
			okOp := slices.Contains([]string{"add", "remove", "replace", "move", "copy", "test"}, op.Op)
			needsValue := slices.Contains([]string{"add", "replace", "test"}, op.Op)
			if !okOp || !strings.HasPrefix(op.Path, "/") || needsValue != (op.Value != nil) {
				errs = append(errs, fmt.Errorf("%s: operation %d (%s %s) is malformed", file, i, op.Op, op.Path))
			}
		}
		return errs
	case roleGenerator:
		if filepath.Base(file) != "models.yaml" {
			return []error{fmt.Errorf("%s: no check for this generator input", file)}
		}
		if _, err := tokenize.ParseConfig(data); err != nil {
			return []error{fmt.Errorf("%s: %w", file, err)}
		}
		return nil
	}
	return []error{fmt.Errorf("%s: no kustomization uses this file", file)}
}

// TestCheckFileCatches: the per-file checks catch an unknown field in a
// resource, a patch and models.yaml, a bad JSON patch, and an orphan file.
func TestCheckFileCatches(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		role       fileRole
		data       string
		want       string
	}{
		{"unknown field in a resource", "x.yaml", roleResource,
			"apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec:\n  selector: {a: b}\n  ports: [{port: 80, protocool: TCP}]\n",
			`unknown field "spec.ports[0].protocool"`},
		{"duplicate field", "x.yaml", roleResource,
			"apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: a}\nmetadata: {name: b}\n", `"metadata" already set`},
		{"unknown kind", "x.yaml", roleResource, "apiVersion: v9\nkind: Thing\nmetadata: {name: a}\n", "no schema for v9 Thing"},
		{"unknown field in a pool", "x.yaml", roleResource,
			"apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata: {name: p}\nspec:\n  selector: {matchLabels: {a: b}}\n" +
				"  targetPorts: [{number: 8000}]\n  endpointPickerRef: {name: k, port: {number: 9002}, failuremode: FailOpen}\n",
			`unknown field "spec.endpointPickerRef.failuremode"`},
		{"unknown field in a patch", "p.yaml", rolePatch,
			"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: a}\nspec: {replica: 2}\n", `unknown field "spec.replica"`},
		{"bad JSON patch", "p.yaml", rolePatch, "- op: rename\n  path: /kind\n", "malformed"},
		{"unknown key in models.yaml", "models.yaml", roleGenerator, "models:\n  - name: m\n    blocksize: 16\n", "blocksize"},
		{"orphan file", "x.yaml", "", "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n", "no kustomization uses this file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := checkFile(tc.file, tc.role, []byte(tc.data))
			if !slices.ContainsFunc(errs, func(e error) bool { return strings.Contains(e.Error(), tc.want) }) {
				t.Errorf("errors %v, want one containing %q", errs, tc.want)
			}
		})
	}
}
