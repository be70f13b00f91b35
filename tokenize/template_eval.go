package tokenize

// Evaluator of the chat-template interpreter: statements, scoping and expressions with
// the semantics of jinja2 3.1 compiled templates in an ImmutableSandboxedEnvironment.
//
// Scoping follows jinja2: {% if %} does not open a scope; every {% for %} iteration,
// macro call, {% with %} and {% block %} does. Names assigned inside a loop body are
// local to that iteration (a loop cannot change an outer variable except through a
// namespace); macros see the variables of the scope they were defined in at call time.

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// jError is a Python exception raised while rendering (TypeError, UndefinedError, ...).
type jError struct {
	kind string
	msg  string
}

func (e *jError) Error() string { return e.msg }

func jErrorf(kind, format string, args ...any) *jError {
	return &jError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// jRaise is raise_exception(msg): jinja2.exceptions.TemplateError(msg).
type jRaise struct{ msg string }

func (e *jRaise) Error() string { return e.msg }

const jkMissing jKind = 255 // an argument that was not passed

// jMaxCallDepth bounds macro recursion (Python would raise RecursionError).
const jMaxCallDepth = 200

// jMaxOutput bounds the rendered size (and any string) so a hostile template/request
// cannot exhaust memory; jMaxItems bounds lists built by concatenation or repetition.
const (
	jMaxOutput = 64 << 20
	jMaxItems  = 1 << 22
)

type jScope struct {
	parent *jScope
	names  []string
	vals   []jv
}

func (s *jScope) lookup(name string) (jv, bool) {
	for sc := s; sc != nil; sc = sc.parent {
		for i := len(sc.names) - 1; i >= 0; i-- {
			if sc.names[i] == name {
				return sc.vals[i], true
			}
		}
	}
	return jv{}, false
}

func (s *jScope) set(name string, v jv) {
	for i := len(s.names) - 1; i >= 0; i-- {
		if s.names[i] == name {
			s.vals[i] = v
			return
		}
	}
	s.names = append(s.names, name)
	s.vals = append(s.vals, v)
}

// jKw holds keyword arguments in call order.
type jKw struct {
	names []string
	vals  []jv
}

func (k jKw) get(name string) (jv, bool) {
	for i, n := range k.names {
		if n == name {
			return k.vals[i], true
		}
	}
	return jv{}, false
}

type jBuiltin func(e *jEval, args []jv, kw jKw) (jv, error)

type jCallable struct {
	name  string
	fn    jBuiltin
	macro *jMacro
	scope *jScope // the scope a macro was defined in
	// bound method (an attribute read without a call)
	recv   jv
	method string
}

type jLoopCtx struct {
	items       []jv
	index0      int
	depth0      int
	changedLast []jv
	changedSet  bool
	node        *jnFor
	scope       *jScope
}

type jCyclerState struct {
	items []jv
	pos   int
}

type jJoinerState struct {
	sep  string
	used bool
}

type jCtl uint8

const (
	jCtlNone jCtl = iota
	jCtlBreak
	jCtlContinue
)

type jEval struct {
	buf   []byte
	depth int
	steps int
	now   func() time.Time
}

// jMaxSteps bounds loop iterations and macro calls per render, so that no template and
// request can keep a gateway busy indefinitely (real chat templates need a few thousand).
const jMaxSteps = 5_000_000

func (e *jEval) step() error {
	e.steps++
	if e.steps > jMaxSteps {
		return jErrorf("RuntimeError", "template execution exceeded %d steps", jMaxSteps)
	}
	return nil
}

func (e *jEval) write(s string) error {
	e.buf = append(e.buf, s...)
	if len(e.buf) > jMaxOutput {
		return jErrorf("MemoryError", "rendered template exceeds %d bytes", jMaxOutput)
	}
	return nil
}

// capture renders body into a string without writing it to the output.
func (e *jEval) capture(body []jNode, s *jScope) (string, error) {
	start := len(e.buf)
	_, err := e.execBody(body, s)
	out := string(e.buf[start:])
	e.buf = e.buf[:start]
	return out, err
}

func (e *jEval) execBody(body []jNode, s *jScope) (jCtl, error) {
	for _, n := range body {
		ctl, err := e.exec(n, s)
		if err != nil || ctl != jCtlNone {
			return ctl, err
		}
	}
	return jCtlNone, nil
}

func (e *jEval) exec(n jNode, s *jScope) (jCtl, error) {
	switch x := n.(type) {
	case *jnData:
		return jCtlNone, e.write(x.s)
	case *jnOutput:
		return jCtlNone, e.output(x.e, s)
	case *jnIf:
		for i, t := range x.tests {
			v, err := e.eval(t, s)
			if err != nil {
				return jCtlNone, err
			}
			if err := jCheckBool(v); err != nil {
				return jCtlNone, err
			}
			if jTruthy(v) {
				return e.execBody(x.bodies[i], s)
			}
		}
		return e.execBody(x.els, s)
	case *jnFor:
		v, err := e.eval(x.iter, s)
		if err != nil {
			return jCtlNone, err
		}
		return jCtlNone, e.execFor(x, v, s, 0)
	case *jnSet:
		v, err := e.eval(x.e, s)
		if err != nil {
			return jCtlNone, err
		}
		return jCtlNone, e.assign(x.target, v, s)
	case *jnSetBlock:
		out, err := e.capture(x.body, s)
		if err != nil {
			return jCtlNone, err
		}
		v := jStrV(out)
		if x.filter != nil {
			if v, err = e.applyFilterChain(x.filter, v, s); err != nil {
				return jCtlNone, err
			}
		}
		return jCtlNone, e.assign(x.target, v, s)
	case *jnMacro:
		s.set(x.m.name, jv{k: jkFunc, o: &jCallable{name: x.m.name, macro: x.m, scope: s}})
		return jCtlNone, nil
	case *jnCallBlock:
		caller := jv{k: jkFunc, o: &jCallable{name: "caller", macro: x.caller, scope: s}}
		fn, err := e.eval(x.call.fn, s)
		if err != nil {
			return jCtlNone, err
		}
		args, kw, err := e.evalArgs(&x.call.args, s)
		if err != nil {
			return jCtlNone, err
		}
		kw.names = append(kw.names, "caller")
		kw.vals = append(kw.vals, caller)
		v, err := e.call(fn, args, kw)
		if err != nil {
			return jCtlNone, err
		}
		return jCtlNone, e.write(jStr(v))
	case *jnFilterBlock:
		out, err := e.capture(x.body, s)
		if err != nil {
			return jCtlNone, err
		}
		v, err := e.applyFilterChain(x.filter, jStrV(out), s)
		if err != nil {
			return jCtlNone, err
		}
		return jCtlNone, e.write(jStr(v))
	case *jnWith:
		inner := &jScope{parent: s}
		for i, t := range x.targets {
			v, err := e.eval(x.vals[i], s)
			if err != nil {
				return jCtlNone, err
			}
			if err := e.assign(t, v, inner); err != nil {
				return jCtlNone, err
			}
		}
		return e.execBody(x.body, inner)
	case *jnBreak:
		return jCtlBreak, nil
	case *jnContinue:
		return jCtlContinue, nil
	case *jnBlock:
		return e.execBody(x.body, &jScope{parent: s})
	case *jnGeneration:
		return e.execBody(x.body, s)
	case *jnUnsupported:
		return jCtlNone, jErrorf("TypeError", "%s", x.msg)
	}
	return jCtlNone, fmt.Errorf("internal: unknown statement %T", n)
}

// jCheckBool is a hook for truth tests that raise; jinja2's Undefined.__bool__ never
// does (not even the sandbox's unsafe Undefined), so nothing fails here.
func jCheckBool(jv) error { return nil }

// output writes {{ expr }}. Chains of + over strings and ~ concatenations are written
// piecewise instead of building intermediate strings.
func (e *jEval) output(x jExpr, s *jScope) error {
	switch t := x.(type) {
	case *jeConst:
		return e.write(jStr(t.v))
	case *jeConcat:
		for _, a := range t.args {
			v, err := e.eval(a, s)
			if err != nil {
				return err
			}
			if err := e.writeValue(v); err != nil {
				return err
			}
		}
		return nil
	case *jeBin:
		if t.op == "+" {
			v, ok, err := e.addChain(t, s, true)
			if err != nil || ok {
				return err
			}
			return e.writeValue(v)
		}
	}
	v, err := e.eval(x, s)
	if err != nil {
		return err
	}
	return e.writeValue(v)
}

func (e *jEval) writeValue(v jv) error {
	if v.k == jkStr {
		return e.write(v.s)
	}
	var b strings.Builder
	jWriteStr(&b, v)
	return e.write(b.String())
}

// addChain evaluates a left-associative chain of + operators. While all operands are
// strings they are concatenated (or, when direct, written to the output: ok=true);
// from the first non-string operand on, Python's pairwise semantics apply.
func (e *jEval) addChain(x *jeBin, s *jScope, direct bool) (jv, bool, error) {
	var ops [16]jExpr
	chain := ops[:0]
	var cur jExpr = x
	for {
		b, ok := cur.(*jeBin)
		if !ok || b.op != "+" {
			break
		}
		chain = append(chain, b.r)
		cur = b.l
	}
	chain = append(chain, cur)
	// chain is reversed: chain[len-1] is the leftmost operand
	first, err := e.eval(chain[len(chain)-1], s)
	if err != nil {
		return jv{}, false, err
	}
	if first.k != jkStr {
		acc, err := e.addRest(first, chain[:len(chain)-1], s)
		return acc, false, err
	}
	if direct {
		start := len(e.buf)
		if err := e.write(first.s); err != nil {
			return jv{}, false, err
		}
		for i := len(chain) - 2; i >= 0; i-- {
			r, err := e.eval(chain[i], s)
			if err != nil {
				e.buf = e.buf[:start]
				return jv{}, false, err
			}
			if r.k != jkStr {
				acc := jStrV(string(e.buf[start:]))
				e.buf = e.buf[:start]
				if acc, err = jAdd(acc, r); err != nil {
					return jv{}, false, err
				}
				acc, err = e.addRest(acc, chain[:i], s)
				return acc, false, err
			}
			if err := e.write(r.s); err != nil {
				return jv{}, false, err
			}
		}
		return jv{}, true, nil
	}
	var parts [16]string
	strs := append(parts[:0], first.s)
	n := len(first.s)
	for i := len(chain) - 2; i >= 0; i-- {
		r, err := e.eval(chain[i], s)
		if err != nil {
			return jv{}, false, err
		}
		if r.k != jkStr {
			acc := jStrV(strings.Join(strs, ""))
			if acc, err = jAdd(acc, r); err != nil {
				return jv{}, false, err
			}
			acc, err = e.addRest(acc, chain[:i], s)
			return acc, false, err
		}
		strs = append(strs, r.s)
		n += len(r.s)
		if n > jMaxOutput {
			return jv{}, false, jErrorf("MemoryError", "string too large")
		}
	}
	if len(strs) == 1 {
		return first, false, nil
	}
	var b strings.Builder
	b.Grow(n)
	for _, p := range strs {
		b.WriteString(p)
	}
	return jStrV(b.String()), false, nil
}

// addRest adds the operands of rest (reversed, as chain is: the last
// element is the next operand) to acc one by one, left to right.
func (e *jEval) addRest(acc jv, rest []jExpr, s *jScope) (jv, error) {
	for i := len(rest) - 1; i >= 0; i-- {
		r, err := e.eval(rest[i], s)
		if err != nil {
			return jv{}, err
		}
		if acc, err = jAdd(acc, r); err != nil {
			return jv{}, err
		}
	}
	return acc, nil
}

// ---- for loops ----

func (e *jEval) execFor(x *jnFor, iterable jv, s *jScope, depth0 int) error {
	items, err := jIterate(iterable)
	if err != nil {
		return err
	}
	if x.cond != nil {
		var kept []jv
		for _, it := range items {
			inner := &jScope{parent: s}
			if err := e.assign(x.target, it, inner); err != nil {
				return err
			}
			c, err := e.eval(x.cond, inner)
			if err != nil {
				return err
			}
			if jTruthy(c) {
				kept = append(kept, it)
			}
		}
		items = kept
	}
	if len(items) == 0 {
		_, err := e.execBody(x.els, s)
		return err
	}
	loop := &jLoopCtx{items: items, depth0: depth0, node: x, scope: s}
	loopV := jv{k: jkLoop, o: loop}
	var inner *jScope
	for i, it := range items {
		if err := e.step(); err != nil {
			return err
		}
		loop.index0 = i
		if inner == nil || x.fresh {
			inner = &jScope{parent: s}
		} else {
			inner.names = inner.names[:0]
			inner.vals = inner.vals[:0]
		}
		inner.names = append(inner.names, "loop")
		inner.vals = append(inner.vals, loopV)
		if err := e.assign(x.target, it, inner); err != nil {
			return err
		}
		ctl, err := e.execBody(x.body, inner)
		if err != nil {
			return err
		}
		if ctl == jCtlBreak {
			break
		}
	}
	return nil
}

// assign binds a target in scope s (tuple targets unpack like Python).
func (e *jEval) assign(t *jTarget, v jv, s *jScope) error {
	if t.attr != "" {
		nsv, _ := s.lookup(t.name)
		if nsv.k != jkNS {
			return jErrorf("TemplateRuntimeError", "cannot assign attribute on non-namespace object")
		}
		nsv.o.(*jNamespace).set(t.attr, v)
		return nil
	}
	if !t.tuple {
		s.set(t.name, v)
		return nil
	}
	items, err := jIterate(v)
	if err != nil {
		if v.k != jkUndef {
			return jErrorf("TypeError", "cannot unpack non-iterable %s object", jValueTypeName(v))
		}
		return err
	}
	if len(items) < len(t.elems) {
		return jErrorf("ValueError", "not enough values to unpack (expected %d, got %d)", len(t.elems), len(items))
	}
	if len(items) > len(t.elems) {
		return jErrorf("ValueError", "too many values to unpack (expected %d)", len(t.elems))
	}
	for i, el := range t.elems {
		if err := e.assign(el, items[i], s); err != nil {
			return err
		}
	}
	return nil
}

// ---- expressions ----

func (e *jEval) eval(x jExpr, s *jScope) (jv, error) {
	switch t := x.(type) {
	case *jeConst:
		return t.v, nil
	case *jeName:
		if v, ok := s.lookup(t.name); ok {
			return v, nil
		}
		return jUndefName(t.name), nil
	case *jeGetattr:
		obj, err := e.eval(t.obj, s)
		if err != nil {
			return jv{}, err
		}
		return e.getattr(obj, t.name)
	case *jeGetitem:
		obj, err := e.eval(t.obj, s)
		if err != nil {
			return jv{}, err
		}
		if sl, ok := t.key.(*jeSlice); ok {
			return e.slice(obj, sl, s)
		}
		key, err := e.eval(t.key, s)
		if err != nil {
			return jv{}, err
		}
		return e.getitem(obj, key)
	case *jeSlice:
		return jv{}, jErrorf("TypeError", "slice is only valid as a subscript")
	case *jeCall:
		return e.evalCall(t, s)
	case *jeFilter:
		var v jv
		if t.e != nil {
			var err error
			if v, err = e.eval(t.e, s); err != nil {
				return jv{}, err
			}
		}
		return e.applyFilter(t, v, s)
	case *jeTest:
		v, err := e.eval(t.e, s)
		if err != nil {
			return jv{}, err
		}
		if t.fn == nil {
			return jv{}, jErrorf("TemplateRuntimeError", "No test named '%s' found.", t.name)
		}
		args, kw, err := e.evalArgs(&t.args, s)
		if err != nil {
			return jv{}, err
		}
		ok, err := t.fn(e, v, args, kw)
		if err != nil {
			return jv{}, err
		}
		return jBoolV(ok), nil
	case *jeNot:
		v, err := e.eval(t.e, s)
		if err != nil {
			return jv{}, err
		}
		if err := jCheckBool(v); err != nil {
			return jv{}, err
		}
		return jBoolV(!jTruthy(v)), nil
	case *jeNeg:
		v, err := e.eval(t.e, s)
		if err != nil {
			return jv{}, err
		}
		return jNeg(v)
	case *jePos:
		v, err := e.eval(t.e, s)
		if err != nil {
			return jv{}, err
		}
		return jPos(v)
	case *jeBin:
		if t.op == "+" {
			v, _, err := e.addChain(t, s, false)
			return v, err
		}
		l, err := e.eval(t.l, s)
		if err != nil {
			return jv{}, err
		}
		r, err := e.eval(t.r, s)
		if err != nil {
			return jv{}, err
		}
		return jBinary(t.op, l, r)
	case *jeAnd:
		l, err := e.eval(t.l, s)
		if err != nil {
			return jv{}, err
		}
		if err := jCheckBool(l); err != nil {
			return jv{}, err
		}
		if !jTruthy(l) {
			return l, nil
		}
		return e.eval(t.r, s)
	case *jeOr:
		l, err := e.eval(t.l, s)
		if err != nil {
			return jv{}, err
		}
		if err := jCheckBool(l); err != nil {
			return jv{}, err
		}
		if jTruthy(l) {
			return l, nil
		}
		return e.eval(t.r, s)
	case *jeCompare:
		l, err := e.eval(t.first, s)
		if err != nil {
			return jv{}, err
		}
		for i, op := range t.ops {
			r, err := e.eval(t.rest[i], s)
			if err != nil {
				return jv{}, err
			}
			ok, err := jCompareOp(op, l, r)
			if err != nil {
				return jv{}, err
			}
			if !ok {
				return jvFalse, nil
			}
			l = r
		}
		return jvTrue, nil
	case *jeConcat:
		var b strings.Builder
		for _, a := range t.args {
			v, err := e.eval(a, s)
			if err != nil {
				return jv{}, err
			}
			jWriteStr(&b, v)
		}
		return jStrV(b.String()), nil
	case *jeCond:
		c, err := e.eval(t.test, s)
		if err != nil {
			return jv{}, err
		}
		if err := jCheckBool(c); err != nil {
			return jv{}, err
		}
		if jTruthy(c) {
			return e.eval(t.yes, s)
		}
		if t.no == nil {
			return jUndefHinted("the inline if-expression evaluated to false and no else section was defined.", false), nil
		}
		return e.eval(t.no, s)
	case *jeList:
		items := make([]jv, len(t.items))
		for i, it := range t.items {
			v, err := e.eval(it, s)
			if err != nil {
				return jv{}, err
			}
			items[i] = v
		}
		return jListV(items), nil
	case *jeTuple:
		items := make([]jv, len(t.items))
		for i, it := range t.items {
			v, err := e.eval(it, s)
			if err != nil {
				return jv{}, err
			}
			items[i] = v
		}
		return jTupleV(items), nil
	case *jeDict:
		d := jNewDict(len(t.keys))
		for i := range t.keys {
			k, err := e.eval(t.keys[i], s)
			if err != nil {
				return jv{}, err
			}
			if !jHashable(k) {
				return jv{}, jErrorf("TypeError", "unhashable type: '%s'", jValueTypeName(k))
			}
			v, err := e.eval(t.vals[i], s)
			if err != nil {
				return jv{}, err
			}
			d.set(k, v)
		}
		return jDictV(d), nil
	}
	return jv{}, fmt.Errorf("internal: unknown expression %T", x)
}

func jCompareOp(op string, l, r jv) (bool, error) {
	switch op {
	case "==":
		return jEqual(l, r), nil
	case "!=":
		return !jEqual(l, r), nil
	case "in":
		return jContains(r, l)
	case "notin":
		ok, err := jContains(r, l)
		return !ok, err
	}
	c, err := jCompare(op, l, r)
	if err == errNaNCompare {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	switch op {
	case "<":
		return c < 0, nil
	case "<=":
		return c <= 0, nil
	case ">":
		return c > 0, nil
	case ">=":
		return c >= 0, nil
	}
	return false, fmt.Errorf("internal: operator %s", op)
}

// jContains is Python's "item in container".
func jContains(container, item jv) (bool, error) {
	switch container.k {
	case jkStr:
		if item.k != jkStr {
			return false, jErrorf("TypeError", "'in <string>' requires string as left operand, not %s", jValueTypeName(item))
		}
		return strings.Contains(container.s, item.s), nil
	case jkList, jkTuple:
		for _, it := range container.list().items {
			if jEqual(it, item) {
				return true, nil
			}
		}
		return false, nil
	case jkDict:
		if !jHashable(item) {
			return false, jErrorf("TypeError", "unhashable type: '%s'", jValueTypeName(item))
		}
		_, ok := container.dict().get(item)
		return ok, nil
	case jkUndef:
		return false, nil
	case jkGen:
		g := container.o.(*jGen)
		for g.pos < len(g.items) {
			it := g.items[g.pos]
			g.pos++
			if jEqual(it, item) {
				return true, nil
			}
		}
		return false, nil
	case jkView:
		w := container.o.(*jView)
		if w.name == "dict_keys" && !jHashable(item) {
			return false, jErrorf("TypeError", "unhashable type: '%s'", jValueTypeName(item))
		}
		for _, it := range w.items {
			if jEqual(it, item) {
				return true, nil
			}
		}
		return false, nil
	case jkLoop:
		for _, it := range container.o.(*jLoopCtx).items {
			if jEqual(it, item) {
				return true, nil
			}
		}
		return false, nil
	}
	return false, jErrorf("TypeError", "argument of type '%s' is not iterable", jValueTypeName(container))
}

// ---- attribute and item access (SandboxedEnvironment.getattr / getitem) ----

var jDictMethods = map[string]bool{"get": true, "items": true, "keys": true, "values": true, "copy": true}
var jDictUnsafe = map[string]bool{"clear": true, "pop": true, "popitem": true, "setdefault": true, "update": true}
var jListMethods = map[string]bool{"count": true, "index": true, "copy": true}
var jListUnsafe = map[string]bool{"append": true, "clear": true, "pop": true, "reverse": true, "insert": true, "sort": true, "extend": true, "remove": true}

// jUnsafe is the Undefined the sandbox returns for a mutating method.
func jUnsafe(obj jv, name string) jv {
	return jUndefHinted(fmt.Sprintf("access to attribute '%s' of '%s' object is unsafe.", name, jValueTypeName(obj)), true)
}

// attribute returns Python getattr(obj, name) when obj has such an attribute.
func (e *jEval) attribute(obj jv, name string) (jv, bool) {
	if strings.HasPrefix(name, "_") {
		if strings.HasPrefix(name, "__") && strings.HasSuffix(name, "__") && len(name) > 4 {
			return jUnsafe(obj, name), true
		}
		return jv{}, false
	}
	switch obj.k {
	case jkDict:
		if jDictMethods[name] {
			return jBoundMethod(obj, name), true
		}
		if jDictUnsafe[name] {
			return jUnsafe(obj, name), true
		}
	case jkList, jkTuple:
		if jListMethods[name] && !(obj.k == jkTuple && name == "copy") {
			return jBoundMethod(obj, name), true
		}
		if obj.k == jkList && jListUnsafe[name] {
			return jUnsafe(obj, name), true
		}
	case jkStr:
		if jStrMethods[name] != nil {
			return jBoundMethod(obj, name), true
		}
	case jkNS:
		return obj.o.(*jNamespace).get(name)
	case jkLoop:
		return e.loopAttr(obj.o.(*jLoopCtx), obj, name)
	case jkCycler:
		c := obj.o.(*jCyclerState)
		switch name {
		case "current":
			return c.items[c.pos], true
		case "next", "reset":
			return jBoundMethod(obj, name), true
		}
	case jkFunc:
		c := obj.o.(*jCallable)
		if c.macro != nil {
			switch name {
			case "name":
				return jStrV(c.macro.name), true
			case "arguments":
				items := make([]jv, len(c.macro.params))
				for i, p := range c.macro.params {
					items[i] = jStrV(p)
				}
				return jTupleV(items), true
			case "catch_kwargs":
				return jBoolV(c.macro.catchKwargs), true
			case "catch_varargs":
				return jBoolV(c.macro.catchVarargs), true
			case "caller":
				return jBoolV(c.macro.usesCaller), true
			}
		}
	case jkFloat:
		switch name {
		case "real":
			return obj, true
		case "imag":
			return jFloatV(0), true
		case "is_integer", "hex", "conjugate", "as_integer_ratio":
			return jBoundMethod(obj, name), true
		}
	case jkInt, jkBig, jkBool:
		switch name {
		case "real", "numerator":
			if obj.k == jkBool {
				return jIntV(obj.n), true
			}
			return obj, true
		case "imag":
			return jIntV(0), true
		case "denominator":
			return jIntV(1), true
		case "bit_length", "conjugate":
			return jBoundMethod(obj, name), true
		}
	}
	return jv{}, false
}

func jBoundMethod(obj jv, name string) jv {
	return jv{k: jkFunc, o: &jCallable{name: jValueTypeName(obj) + "." + name, recv: obj, method: name}}
}

// getattr is obj.name: the attribute, else the item, else Undefined.
func (e *jEval) getattr(obj jv, name string) (jv, error) {
	if obj.k == jkUndef {
		return jv{}, jUndefError(obj)
	}
	if obj.k == jkDict {
		// fast path for the common message.role / tool.function lookups
		if !jDictMethods[name] && !jDictUnsafe[name] && !strings.HasPrefix(name, "__") {
			if v, ok := obj.dict().getStr(name); ok {
				return v, nil
			}
			return jUndefAttr(obj, name), nil
		}
	}
	if v, ok := e.attribute(obj, name); ok {
		return v, nil
	}
	switch obj.k {
	case jkDict:
		if v, ok := obj.dict().getStr(name); ok {
			return v, nil
		}
	}
	return jUndefAttr(obj, name), nil
}

// getitem is obj[key]: the item, else (for string keys) the attribute, else Undefined.
func (e *jEval) getitem(obj jv, key jv) (jv, error) {
	switch obj.k {
	case jkUndef:
		return jv{}, jUndefError(obj)
	case jkDict:
		if jHashable(key) {
			if v, ok := obj.dict().get(key); ok {
				return v, nil
			}
		}
	case jkList, jkTuple, jkStr:
		if key.k == jkInt || key.k == jkBool || key.k == jkBig {
			n := 0
			if obj.k == jkStr {
				n = jStrLen(obj.s)
			} else {
				n = len(obj.list().items)
			}
			if key.k != jkBig {
				i := key.n
				if i < 0 {
					i += int64(n)
				}
				if i >= 0 && i < int64(n) {
					if obj.k == jkStr {
						return jStrV(jStrIndex(obj.s, int(i))), nil
					}
					return obj.list().items[i], nil
				}
			}
			return jUndefElem(obj, key), nil
		}
	case jkLoop, jkNS, jkCycler:
	}
	if key.k == jkStr {
		if v, ok := e.attribute(obj, key.s); ok {
			return v, nil
		}
		return jUndefAttr(obj, key.s), nil
	}
	return jUndefElem(obj, key), nil
}

// jStrIndex returns the i-th code point of s as a string.
func jStrIndex(s string, i int) string {
	if jIsASCII(s) {
		return s[i : i+1]
	}
	for pos := range s {
		if i == 0 {
			_, size := utf8.DecodeRuneInString(s[pos:])
			return s[pos : pos+size]
		}
		i--
	}
	return ""
}

func (e *jEval) slice(obj jv, sl *jeSlice, s *jScope) (jv, error) {
	var bounds [3]jv
	for i, x := range []jExpr{sl.start, sl.stop, sl.step} {
		if x == nil {
			bounds[i] = jvNone
			continue
		}
		v, err := e.eval(x, s)
		if err != nil {
			return jv{}, err
		}
		bounds[i] = v
	}
	switch obj.k {
	case jkUndef:
		return jv{}, jUndefError(obj)
	case jkList, jkTuple, jkStr:
	default:
		return jUndefElem(obj, jvNone), nil
	}
	var n int
	var runes []rune
	if obj.k == jkStr {
		if jIsASCII(obj.s) {
			n = len(obj.s)
		} else {
			runes = []rune(obj.s)
			n = len(runes)
		}
	} else {
		n = len(obj.list().items)
	}
	idx := make([]int64, 3)
	for i, b := range bounds {
		switch b.k {
		case jkNone:
			idx[i] = math.MinInt64
		case jkInt, jkBool:
			idx[i] = b.n
		case jkBig:
			if b.o.(*big.Int).Sign() > 0 {
				idx[i] = math.MaxInt64 / 2
			} else {
				idx[i] = -math.MaxInt64 / 2
			}
		case jkUndef:
			return jv{}, jUndefError(b)
		default:
			return jv{}, jErrorf("TypeError", "slice indices must be integers or None or have an __index__ method")
		}
	}
	start, stop, step, err := jSliceIndices(idx[0], idx[1], idx[2], n)
	if err != nil {
		return jv{}, err
	}
	switch obj.k {
	case jkStr:
		if runes == nil && step == 1 {
			if stop < start {
				return jvEmptyStr, nil
			}
			return jStrV(obj.s[start:stop]), nil
		}
		if runes == nil {
			runes = []rune(obj.s)
		}
		var b strings.Builder
		for i := start; (step > 0 && i < stop) || (step < 0 && i > stop); i += step {
			b.WriteRune(runes[i])
		}
		return jStrV(b.String()), nil
	default:
		src := obj.list().items
		var out []jv
		for i := start; (step > 0 && i < stop) || (step < 0 && i > stop); i += step {
			out = append(out, src[i])
		}
		if obj.k == jkTuple {
			return jTupleV(out), nil
		}
		return jListV(out), nil
	}
}

// jSliceIndices is slice.indices(n); absent bounds are math.MinInt64.
func jSliceIndices(start, stop, step int64, n int) (int, int, int, error) {
	st := int64(1)
	if step != math.MinInt64 {
		st = step
	}
	if st == 0 {
		return 0, 0, 0, jErrorf("ValueError", "slice step cannot be zero")
	}
	ln := int64(n)
	clamp := func(v int64, def int64) int64 {
		if v == math.MinInt64 {
			return def
		}
		if v < 0 {
			v += ln
			if v < 0 {
				if st < 0 {
					return -1
				}
				return 0
			}
		} else if v >= ln {
			if st < 0 {
				return ln - 1
			}
			return ln
		}
		return v
	}
	var s, e int64
	if st > 0 {
		s, e = clamp(start, 0), clamp(stop, ln)
	} else {
		s, e = clamp(start, ln-1), clamp(stop, -1)
	}
	return int(s), int(e), int(st), nil
}

// ---- calls ----

func (e *jEval) evalArgs(a *jArgs, s *jScope) ([]jv, jKw, error) {
	var kw jKw
	var args []jv
	if len(a.pos) > 0 {
		args = make([]jv, 0, len(a.pos))
		for _, x := range a.pos {
			v, err := e.eval(x, s)
			if err != nil {
				return nil, kw, err
			}
			args = append(args, v)
		}
	}
	for i, name := range a.kwNames {
		v, err := e.eval(a.kwVals[i], s)
		if err != nil {
			return nil, kw, err
		}
		kw.names = append(kw.names, name)
		kw.vals = append(kw.vals, v)
	}
	if a.dynArgs != nil {
		v, err := e.eval(a.dynArgs, s)
		if err != nil {
			return nil, kw, err
		}
		items, err := jIterate(v)
		if err != nil {
			return nil, kw, err
		}
		args = append(args, items...)
	}
	if a.dynKw != nil {
		v, err := e.eval(a.dynKw, s)
		if err != nil {
			return nil, kw, err
		}
		if v.k != jkDict {
			return nil, kw, jErrorf("TypeError", "argument after ** must be a mapping, not %s", jValueTypeName(v))
		}
		d := v.dict()
		for i, k := range d.keys {
			if k.k != jkStr {
				return nil, kw, jErrorf("TypeError", "keywords must be strings")
			}
			kw.names = append(kw.names, k.s)
			kw.vals = append(kw.vals, d.vals[i])
		}
	}
	return args, kw, nil
}

func (e *jEval) evalCall(t *jeCall, s *jScope) (jv, error) {
	// obj.method(...) without materialising a bound method
	if ga, ok := t.fn.(*jeGetattr); ok {
		obj, err := e.eval(ga.obj, s)
		if err != nil {
			return jv{}, err
		}
		if m := jDirectMethod(obj, ga.name); m != nil {
			args, kw, err := e.evalArgs(&t.args, s)
			if err != nil {
				return jv{}, err
			}
			return m(e, obj, args, kw)
		}
		fn, err := e.getattr(obj, ga.name)
		if err != nil {
			return jv{}, err
		}
		args, kw, err := e.evalArgs(&t.args, s)
		if err != nil {
			return jv{}, err
		}
		return e.call(fn, args, kw)
	}
	fn, err := e.eval(t.fn, s)
	if err != nil {
		return jv{}, err
	}
	args, kw, err := e.evalArgs(&t.args, s)
	if err != nil {
		return jv{}, err
	}
	return e.call(fn, args, kw)
}

// jMethodFn implements a Python method of a builtin type.
type jMethodFn func(e *jEval, recv jv, args []jv, kw jKw) (jv, error)

// jDirectMethod returns the method obj.name when attribute lookup would find one.
func jDirectMethod(obj jv, name string) jMethodFn {
	switch obj.k {
	case jkStr:
		return jStrMethods[name]
	case jkDict:
		if jDictMethods[name] {
			return jDictMethodFns[name]
		}
	case jkList, jkTuple:
		if jListMethods[name] && !(obj.k == jkTuple && name == "copy") {
			return jListMethodFns[name]
		}
	}
	return nil
}

func (e *jEval) call(fn jv, args []jv, kw jKw) (jv, error) {
	switch fn.k {
	case jkUndef:
		return jv{}, jUndefError(fn)
	case jkFunc:
	case jkCycler, jkJoiner:
		if fn.k == jkJoiner {
			j := fn.o.(*jJoinerState)
			if !j.used {
				j.used = true
				return jvEmptyStr, nil
			}
			return jStrV(j.sep), nil
		}
		return jv{}, jErrorf("TypeError", "'Cycler' object is not callable")
	case jkLoop:
		l := fn.o.(*jLoopCtx)
		if !l.node.recursive {
			return jv{}, jErrorf("TypeError", "The loop must be marked as 'recursive' to call it.")
		}
		if len(args) != 1 || len(kw.names) > 0 {
			return jv{}, jErrorf("TypeError", "loop() takes exactly one argument")
		}
		if e.depth >= jMaxCallDepth {
			return jv{}, jErrorf("RecursionError", "maximum recursion depth exceeded")
		}
		e.depth++
		start := len(e.buf)
		err := e.execFor(l.node, args[0], l.scope, l.depth0+1)
		out := string(e.buf[start:])
		e.buf = e.buf[:start]
		e.depth--
		if err != nil {
			return jv{}, err
		}
		return jStrV(out), nil
	default:
		return jv{}, jErrorf("TypeError", "'%s' object is not callable", jValueTypeName(fn))
	}
	c := fn.o.(*jCallable)
	switch {
	case c.fn != nil:
		return c.fn(e, args, kw)
	case c.macro != nil:
		return e.callMacro(c, args, kw)
	case c.method != "":
		return e.callMethod(c.recv, c.method, args, kw)
	}
	return jv{}, jErrorf("TypeError", "'%s' object is not callable", c.name)
}

func (e *jEval) callMethod(recv jv, name string, args []jv, kw jKw) (jv, error) {
	if m := jDirectMethod(recv, name); m != nil {
		return m(e, recv, args, kw)
	}
	switch recv.k {
	case jkCycler:
		c := recv.o.(*jCyclerState)
		switch name {
		case "next":
			v := c.items[c.pos]
			c.pos = (c.pos + 1) % len(c.items)
			return v, nil
		case "reset":
			c.pos = 0
			return jvNone, nil
		}
	case jkLoop:
		return e.loopMethod(recv.o.(*jLoopCtx), name, args, kw)
	case jkFloat:
		switch name {
		case "is_integer":
			return jBoolV(recv.f == math.Trunc(recv.f) && !math.IsInf(recv.f, 0)), nil
		case "conjugate":
			return recv, nil
		}
	case jkInt, jkBig, jkBool:
		switch name {
		case "bit_length":
			return jIntV(int64(new(big.Int).Abs(jBigOf(recv)).BitLen())), nil
		case "conjugate":
			return jIntV(recv.n), nil
		}
	}
	return jv{}, jErrorf("TypeError", "method %s.%s is not supported", jValueTypeName(recv), name)
}

func (e *jEval) callMacro(c *jCallable, args []jv, kw jKw) (jv, error) {
	m := c.macro
	if err := e.step(); err != nil {
		return jv{}, err
	}
	if e.depth >= jMaxCallDepth {
		return jv{}, jErrorf("RecursionError", "maximum recursion depth exceeded")
	}
	inner := &jScope{parent: c.scope}
	nParams := len(m.params)
	values := make([]jv, nParams)
	for i := range values {
		values[i] = jv{k: jkMissing}
	}
	copy(values, args)
	// keyword arguments fill the parameters after the positional ones
	used := make([]bool, len(kw.names))
	for i := len(args); i < nParams; i++ {
		for j, n := range kw.names {
			if n == m.params[i] && !used[j] {
				values[i] = kw.vals[j]
				used[j] = true
				break
			}
		}
	}
	var caller jv
	callerSet := false
	var extra jKw
	for j, n := range kw.names {
		if used[j] {
			continue
		}
		if n == "caller" && m.usesCaller && !callerSet {
			caller, callerSet = kw.vals[j], true
			continue
		}
		extra.names = append(extra.names, n)
		extra.vals = append(extra.vals, kw.vals[j])
	}
	if !m.catchKwargs && len(extra.names) > 0 {
		for _, n := range extra.names {
			if n == "caller" {
				return jv{}, jErrorf("TypeError", "macro '%s' was invoked with two values for the special caller argument. This is most likely a bug.", m.name)
			}
		}
		return jv{}, jErrorf("TypeError", "macro '%s' takes no keyword argument '%s'", m.name, extra.names[0])
	}
	if !m.catchVarargs && len(args) > nParams {
		return jv{}, jErrorf("TypeError", "macro '%s' takes not more than %d argument(s)", m.name, nParams)
	}
	firstDefault := nParams - len(m.defaults)
	for i, p := range m.params {
		v := values[i]
		if v.k == jkMissing {
			if i >= firstDefault {
				var err error
				if v, err = e.eval(m.defaults[i-firstDefault], inner); err != nil {
					return jv{}, err
				}
			} else {
				v = jUndefHinted(fmt.Sprintf("parameter %s was not provided", jPyQuote(p)), false)
			}
		}
		inner.set(p, v)
	}
	explicitCaller := false
	for _, p := range m.params {
		if p == "caller" {
			explicitCaller = true
		}
	}
	if m.usesCaller && !explicitCaller {
		if !callerSet {
			caller = jUndefHinted("No caller defined", false)
		}
		inner.set("caller", caller)
	}
	if m.catchKwargs {
		d := jNewDict(len(extra.names))
		for i, n := range extra.names {
			d.set(jStrV(n), extra.vals[i])
		}
		inner.set("kwargs", jDictV(d))
	}
	if m.catchVarargs {
		var rest []jv
		if len(args) > nParams {
			rest = append(rest, args[nParams:]...)
		}
		inner.set("varargs", jTupleV(rest))
	}
	e.depth++
	out, err := e.capture(m.body, inner)
	e.depth--
	if err != nil {
		return jv{}, err
	}
	return jStrV(out), nil
}

// ---- loop object ----

func (e *jEval) loopAttr(l *jLoopCtx, self jv, name string) (jv, bool) {
	n := len(l.items)
	switch name {
	case "index":
		return jIntV(int64(l.index0 + 1)), true
	case "index0":
		return jIntV(int64(l.index0)), true
	case "revindex":
		return jIntV(int64(n - l.index0)), true
	case "revindex0":
		return jIntV(int64(n - l.index0 - 1)), true
	case "first":
		return jBoolV(l.index0 == 0), true
	case "last":
		return jBoolV(l.index0 == n-1), true
	case "length":
		return jIntV(int64(n)), true
	case "depth":
		return jIntV(int64(l.depth0 + 1)), true
	case "depth0":
		return jIntV(int64(l.depth0)), true
	case "previtem":
		if l.index0 > 0 {
			return l.items[l.index0-1], true
		}
		return jUndefHinted("there is no previous item", false), true
	case "nextitem":
		if l.index0+1 < n {
			return l.items[l.index0+1], true
		}
		return jUndefHinted("there is no next item", false), true
	case "cycle", "changed":
		return jBoundMethod(self, name), true
	}
	return jv{}, false
}

func (e *jEval) loopMethod(l *jLoopCtx, name string, args []jv, kw jKw) (jv, error) {
	switch name {
	case "cycle":
		if len(args) == 0 {
			return jv{}, jErrorf("TypeError", "no items for cycling given")
		}
		return args[l.index0%len(args)], nil
	case "changed":
		if l.changedSet && len(l.changedLast) == len(args) {
			same := true
			for i := range args {
				if !jEqual(args[i], l.changedLast[i]) {
					same = false
					break
				}
			}
			if same {
				return jvFalse, nil
			}
		}
		l.changedLast = append([]jv(nil), args...)
		l.changedSet = true
		return jvTrue, nil
	}
	return jv{}, jErrorf("TypeError", "'LoopContext' object has no method %s", name)
}

// ---- arithmetic ----

func jNumOperands(a, b jv) bool { return a.isNumber() && b.isNumber() }

func jAsFloat(v jv) (float64, error) {
	switch v.k {
	case jkFloat:
		return v.f, nil
	case jkInt, jkBool:
		return float64(v.n), nil
	case jkBig:
		f, _ := new(big.Float).SetInt(v.o.(*big.Int)).Float64()
		if math.IsInf(f, 0) {
			return 0, jErrorf("OverflowError", "int too large to convert to float")
		}
		return f, nil
	}
	return 0, jErrorf("TypeError", "must be real number, not %s", jValueTypeName(v))
}

func jUnsupported(op string, a, b jv) error {
	if a.k == jkUndef {
		return jUndefError(a)
	}
	if b.k == jkUndef {
		return jUndefError(b)
	}
	return jErrorf("TypeError", "unsupported operand type(s) for %s: '%s' and '%s'", op, jValueTypeName(a), jValueTypeName(b))
}

func jAdd(a, b jv) (jv, error) {
	if jNumOperands(a, b) {
		if a.k == jkFloat || b.k == jkFloat {
			x, err := jAsFloat(a)
			if err != nil {
				return jv{}, err
			}
			y, err := jAsFloat(b)
			if err != nil {
				return jv{}, err
			}
			return jFloatV(x + y), nil
		}
		if a.k != jkBig && b.k != jkBig {
			s := a.n + b.n
			if (s > a.n) == (b.n > 0) {
				return jIntV(s), nil
			}
		}
		return jBigV(new(big.Int).Add(jBigOf(a), jBigOf(b))), nil
	}
	switch {
	case a.k == jkUndef:
		return jv{}, jUndefError(a)
	case b.k == jkUndef:
		return jv{}, jUndefError(b)
	case a.k == jkStr && b.k == jkStr:
		if len(a.s)+len(b.s) > jMaxOutput {
			return jv{}, jErrorf("MemoryError", "string too large")
		}
		return jStrV(a.s + b.s), nil
	case a.k == jkStr:
		return jv{}, jErrorf("TypeError", "can only concatenate str (not \"%s\") to str", jValueTypeName(b))
	case (a.k == jkList && b.k == jkList) || (a.k == jkTuple && b.k == jkTuple):
		if len(a.list().items)+len(b.list().items) > jMaxItems {
			return jv{}, jErrorf("MemoryError", "sequence too large")
		}
	}
	switch {
	case a.k == jkList && b.k == jkList:
		x, y := a.list().items, b.list().items
		out := make([]jv, 0, len(x)+len(y))
		return jListV(append(append(out, x...), y...)), nil
	case a.k == jkList:
		return jv{}, jErrorf("TypeError", "can only concatenate list (not \"%s\") to list", jValueTypeName(b))
	case a.k == jkTuple && b.k == jkTuple:
		x, y := a.list().items, b.list().items
		out := make([]jv, 0, len(x)+len(y))
		return jTupleV(append(append(out, x...), y...)), nil
	case a.k == jkTuple:
		return jv{}, jErrorf("TypeError", "can only concatenate tuple (not \"%s\") to tuple", jValueTypeName(b))
	}
	return jv{}, jUnsupported("+", a, b)
}

func jNeg(v jv) (jv, error) {
	switch v.k {
	case jkInt, jkBool:
		if v.n == math.MinInt64 {
			return jBigV(new(big.Int).Neg(jBigOf(v))), nil
		}
		return jIntV(-v.n), nil
	case jkBig:
		return jBigV(new(big.Int).Neg(v.o.(*big.Int))), nil
	case jkFloat:
		return jFloatV(-v.f), nil
	case jkUndef:
		return jv{}, jUndefError(v)
	}
	return jv{}, jErrorf("TypeError", "bad operand type for unary -: '%s'", jValueTypeName(v))
}

func jPos(v jv) (jv, error) {
	switch v.k {
	case jkInt, jkBool:
		return jIntV(v.n), nil
	case jkBig, jkFloat:
		return v, nil
	case jkUndef:
		return jv{}, jUndefError(v)
	}
	return jv{}, jErrorf("TypeError", "bad operand type for unary +: '%s'", jValueTypeName(v))
}

func jRepeat(seq jv, count jv) (jv, error) {
	if count.k == jkBig {
		if count.o.(*big.Int).Sign() < 0 {
			count = jIntV(0)
		} else {
			return jv{}, jErrorf("OverflowError", "cannot fit 'int' into an index-sized integer")
		}
	}
	n := count.n
	if n < 0 {
		n = 0
	}
	switch seq.k {
	case jkStr:
		if int64(len(seq.s))*n > jMaxOutput {
			return jv{}, jErrorf("MemoryError", "repeated string too large")
		}
		return jStrV(strings.Repeat(seq.s, int(n))), nil
	default:
		items := seq.list().items
		if int64(len(items))*n > jMaxItems {
			return jv{}, jErrorf("MemoryError", "repeated sequence too large")
		}
		out := make([]jv, 0, int64(len(items))*n)
		for i := int64(0); i < n; i++ {
			out = append(out, items...)
		}
		if seq.k == jkTuple {
			return jTupleV(out), nil
		}
		return jListV(out), nil
	}
}

func jBinary(op string, a, b jv) (jv, error) {
	switch op {
	case "+":
		return jAdd(a, b)
	case "-":
		if !jNumOperands(a, b) {
			return jv{}, jUnsupported("-", a, b)
		}
		if a.k == jkFloat || b.k == jkFloat {
			x, err := jAsFloat(a)
			if err != nil {
				return jv{}, err
			}
			y, err := jAsFloat(b)
			if err != nil {
				return jv{}, err
			}
			return jFloatV(x - y), nil
		}
		if a.k != jkBig && b.k != jkBig {
			d := a.n - b.n
			if (d < a.n) == (b.n > 0) {
				return jIntV(d), nil
			}
		}
		return jBigV(new(big.Int).Sub(jBigOf(a), jBigOf(b))), nil
	case "*":
		switch {
		case jNumOperands(a, b):
			if a.k == jkFloat || b.k == jkFloat {
				x, err := jAsFloat(a)
				if err != nil {
					return jv{}, err
				}
				y, err := jAsFloat(b)
				if err != nil {
					return jv{}, err
				}
				return jFloatV(x * y), nil
			}
			if a.k != jkBig && b.k != jkBig {
				if a.n == 0 || b.n == 0 {
					return jIntV(0), nil
				}
				p := a.n * b.n
				if p/b.n == a.n && !(a.n == -1 && b.n == math.MinInt64) && !(b.n == -1 && a.n == math.MinInt64) {
					return jIntV(p), nil
				}
			}
			return jBigV(new(big.Int).Mul(jBigOf(a), jBigOf(b))), nil
		case (a.k == jkStr || a.isSeq()) && b.isInteger():
			return jRepeat(a, b)
		case a.isInteger() && (b.k == jkStr || b.isSeq()):
			return jRepeat(b, a)
		}
		if (a.k == jkStr || a.isSeq()) && b.k != jkUndef && b.k != jkFloat {
			return jv{}, jErrorf("TypeError", "can't multiply sequence by non-int of type '%s'", jValueTypeName(b))
		}
		return jv{}, jUnsupported("*", a, b)
	case "/":
		if !jNumOperands(a, b) {
			return jv{}, jUnsupported("/", a, b)
		}
		x, err := jAsFloat(a)
		if err != nil {
			return jv{}, err
		}
		y, err := jAsFloat(b)
		if err != nil {
			return jv{}, err
		}
		if y == 0 {
			if a.k == jkFloat || b.k == jkFloat {
				return jv{}, jErrorf("ZeroDivisionError", "float division by zero")
			}
			return jv{}, jErrorf("ZeroDivisionError", "division by zero")
		}
		return jFloatV(x / y), nil
	case "//", "%":
		if op == "%" && a.k == jkStr {
			s, err := jPercentFormat(a.s, b)
			if err != nil {
				return jv{}, err
			}
			return jStrV(s), nil
		}
		if !jNumOperands(a, b) {
			return jv{}, jUnsupported(op, a, b)
		}
		if a.k == jkFloat || b.k == jkFloat {
			x, err := jAsFloat(a)
			if err != nil {
				return jv{}, err
			}
			y, err := jAsFloat(b)
			if err != nil {
				return jv{}, err
			}
			if y == 0 {
				if op == "%" {
					return jv{}, jErrorf("ZeroDivisionError", "float modulo")
				}
				return jv{}, jErrorf("ZeroDivisionError", "float floor division by zero")
			}
			div, mod := jFloatDivmod(x, y)
			if op == "%" {
				return jFloatV(mod), nil
			}
			return jFloatV(div), nil
		}
		if (b.k != jkBig && b.n == 0) || (b.k == jkBig && b.o.(*big.Int).Sign() == 0) {
			return jv{}, jErrorf("ZeroDivisionError", "integer division or modulo by zero")
		}
		if a.k != jkBig && b.k != jkBig && !(a.n == math.MinInt64 && b.n == -1) {
			q, r := a.n/b.n, a.n%b.n
			if r != 0 && (r < 0) != (b.n < 0) {
				q--
				r += b.n
			}
			if op == "%" {
				return jIntV(r), nil
			}
			return jIntV(q), nil
		}
		x, y := jBigOf(a), jBigOf(b)
		q, m := new(big.Int), new(big.Int)
		q.DivMod(x, y, m) // Euclidean: 0 <= m < |y|
		if m.Sign() != 0 && y.Sign() < 0 {
			m.Add(m, y)
			q.Add(q, big.NewInt(1))
		}
		if op == "%" {
			return jBigV(m), nil
		}
		return jBigV(q), nil
	case "**":
		if !jNumOperands(a, b) {
			return jv{}, jUnsupported("** or pow()", a, b)
		}
		if a.k != jkFloat && b.k != jkFloat {
			exp := jBigOf(b)
			if exp.Sign() >= 0 {
				base := jBigOf(a)
				if exp.BitLen() > 32 || int64(base.BitLen())*exp.Int64() > 1<<20 {
					if base.BitLen() > 1 || base.Sign() < 0 && base.BitLen() > 1 {
						return jv{}, jErrorf("OverflowError", "integer power result too large")
					}
				}
				return jBigV(new(big.Int).Exp(base, exp, nil)), nil
			}
		}
		x, err := jAsFloat(a)
		if err != nil {
			return jv{}, err
		}
		y, err := jAsFloat(b)
		if err != nil {
			return jv{}, err
		}
		if x == 0 && y < 0 {
			return jv{}, jErrorf("ZeroDivisionError", "0.0 cannot be raised to a negative power")
		}
		if x < 0 && y != math.Trunc(y) {
			return jv{}, jErrorf("ValueError", "complex results are not supported")
		}
		r := math.Pow(x, y)
		if math.IsInf(r, 0) && !math.IsInf(x, 0) && !math.IsInf(y, 0) {
			return jv{}, jErrorf("OverflowError", "(34, 'Numerical result out of range')")
		}
		return jFloatV(r), nil
	}
	return jv{}, fmt.Errorf("internal: operator %s", op)
}

// jFloatDivmod is Python's float divmod.
func jFloatDivmod(vx, wx float64) (float64, float64) {
	mod := math.Mod(vx, wx)
	div := (vx - mod) / wx
	if mod != 0 {
		if (wx < 0) != (mod < 0) {
			mod += wx
			div -= 1.0
		}
	} else {
		mod = math.Copysign(0, wx)
	}
	var floordiv float64
	if div != 0 {
		floordiv = math.Floor(div)
		if div-floordiv > 0.5 {
			floordiv += 1.0
		}
	} else {
		floordiv = math.Copysign(0, vx/wx)
	}
	return floordiv, mod
}

// ---- printf-style formatting (str % args) ----

func jPercentFormat(format string, arg jv) (string, error) {
	var args []jv
	var mapping *jDict
	switch arg.k {
	case jkTuple:
		args = arg.list().items
	case jkDict:
		mapping = arg.dict()
		args = []jv{arg}
	default:
		args = []jv{arg}
	}
	var b strings.Builder
	ai := 0
	usedMapping := false
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		i++
		if i >= len(format) {
			return "", jErrorf("ValueError", "incomplete format")
		}
		var val jv
		haveVal := false
		if format[i] == '(' {
			if mapping == nil {
				return "", jErrorf("TypeError", "format requires a mapping")
			}
			end := strings.IndexByte(format[i:], ')')
			if end < 0 {
				return "", jErrorf("ValueError", "incomplete format key")
			}
			key := format[i+1 : i+end]
			v, ok := mapping.getStr(key)
			if !ok {
				return "", jErrorf("KeyError", "%s", jPyQuote(key))
			}
			val, haveVal, usedMapping = v, true, true
			i += end + 1
		}
		flags := ""
		for i < len(format) && strings.IndexByte("-+ #0", format[i]) >= 0 {
			flags += string(format[i])
			i++
		}
		width := -1
		if i < len(format) && format[i] == '*' {
			if ai >= len(args) {
				return "", jErrorf("TypeError", "not enough arguments for format string")
			}
			width = int(args[ai].n)
			ai++
			i++
		} else {
			for i < len(format) && format[i] >= '0' && format[i] <= '9' {
				if width < 0 {
					width = 0
				}
				width = width*10 + int(format[i]-'0')
				i++
			}
		}
		prec := -1
		if i < len(format) && format[i] == '.' {
			i++
			prec = 0
			for i < len(format) && format[i] >= '0' && format[i] <= '9' {
				prec = prec*10 + int(format[i]-'0')
				i++
			}
		}
		for i < len(format) && (format[i] == 'l' || format[i] == 'h' || format[i] == 'L') {
			i++
		}
		if i >= len(format) {
			return "", jErrorf("ValueError", "incomplete format")
		}
		conv := format[i]
		if conv == '%' {
			b.WriteByte('%')
			continue
		}
		if !haveVal {
			if ai >= len(args) {
				return "", jErrorf("TypeError", "not enough arguments for format string")
			}
			val = args[ai]
			ai++
		}
		s, err := jFormatOne(conv, flags, prec, val)
		if err != nil {
			return "", err
		}
		b.WriteString(jPad(s, width, flags, conv))
	}
	if ai < len(args) && !usedMapping && mapping == nil {
		return "", jErrorf("TypeError", "not all arguments converted during string formatting")
	}
	return b.String(), nil
}

func jPad(s string, width int, flags string, conv byte) string {
	n := jStrLen(s)
	if width <= n {
		return s
	}
	fill := width - n
	switch {
	case strings.Contains(flags, "-"):
		return s + strings.Repeat(" ", fill)
	case strings.Contains(flags, "0") && strings.IndexByte("diouxXeEfFgG", conv) >= 0:
		sign := ""
		if s != "" && (s[0] == '-' || s[0] == '+' || s[0] == ' ') {
			sign, s = s[:1], s[1:]
		}
		return sign + strings.Repeat("0", fill) + s
	}
	return strings.Repeat(" ", fill) + s
}

func jFormatOne(conv byte, flags string, prec int, v jv) (string, error) {
	if v.k == jkUndef && conv != 's' {
		return "", jUndefError(v)
	}
	sign := func(s string, neg bool) string {
		switch {
		case neg:
			return "-" + s
		case strings.Contains(flags, "+"):
			return "+" + s
		case strings.Contains(flags, " "):
			return " " + s
		}
		return s
	}
	switch conv {
	case 's':
		s := jStr(v)
		if prec >= 0 {
			s = jTruncRunes(s, prec)
		}
		return s, nil
	case 'r', 'a':
		s := jRepr(v)
		if prec >= 0 {
			s = jTruncRunes(s, prec)
		}
		return s, nil
	case 'd', 'i', 'u':
		if !v.isNumber() {
			return "", jErrorf("TypeError", "%%%c format: a real number is required, not %s", conv, jValueTypeName(v))
		}
		var n *big.Int
		if v.k == jkFloat {
			if math.IsInf(v.f, 0) || math.IsNaN(v.f) {
				return "", jErrorf("OverflowError", "cannot convert float infinity to integer")
			}
			n, _ = new(big.Float).SetFloat64(math.Trunc(v.f)).Int(nil)
		} else {
			n = jBigOf(v)
		}
		s := new(big.Int).Abs(n).String()
		for prec > len(s) {
			s = "0" + s
		}
		return sign(s, n.Sign() < 0), nil
	case 'x', 'X', 'o':
		if !v.isInteger() {
			return "", jErrorf("TypeError", "%%%c format: an integer is required, not %s", conv, jValueTypeName(v))
		}
		n := jBigOf(v)
		base := 16
		if conv == 'o' {
			base = 8
		}
		s := new(big.Int).Abs(n).Text(base)
		if conv == 'X' {
			s = strings.ToUpper(s)
		}
		if strings.Contains(flags, "#") {
			s = map[byte]string{'x': "0x", 'X': "0X", 'o': "0o"}[conv] + s
		}
		return sign(s, n.Sign() < 0), nil
	case 'e', 'E', 'f', 'F', 'g', 'G':
		f, err := jAsFloat(v)
		if err != nil {
			return "", jErrorf("TypeError", "must be real number, not %s", jValueTypeName(v))
		}
		if prec < 0 {
			prec = 6
		}
		return sign(jFormatFloat(math.Abs(f), conv, prec, strings.Contains(flags, "#")), math.Signbit(f) && !math.IsNaN(f)), nil
	case 'c':
		if v.k == jkStr && jStrLen(v.s) == 1 {
			return v.s, nil
		}
		if v.isInteger() {
			return string(rune(v.n)), nil
		}
		return "", jErrorf("TypeError", "%%c requires int or char")
	}
	return "", jErrorf("ValueError", "unsupported format character '%c' (0x%x)", conv, conv)
}

func jTruncRunes(s string, n int) string {
	i := 0
	for pos := range s {
		if i == n {
			return s[:pos]
		}
		i++
	}
	return s
}

// jFormatFloat formats a non-negative float like Python's %e/%f/%g.
func jFormatFloat(f float64, conv byte, prec int, alt bool) string {
	if math.IsInf(f, 0) {
		if conv >= 'a' {
			return "inf"
		}
		return "INF"
	}
	if math.IsNaN(f) {
		if conv >= 'a' {
			return "nan"
		}
		return "NAN"
	}
	switch conv {
	case 'f', 'F':
		return strconv.FormatFloat(f, 'f', prec, 64)
	case 'e', 'E':
		s := strconv.FormatFloat(f, 'e', prec, 64)
		if conv == 'E' {
			s = strings.ToUpper(s)
		}
		return s
	}
	// %g
	if prec == 0 {
		prec = 1
	}
	exp := 0
	if f != 0 {
		es := strconv.FormatFloat(f, 'e', prec-1, 64)
		exp, _ = strconv.Atoi(es[strings.IndexByte(es, 'e')+1:])
	}
	var s string
	if exp < -4 || exp >= prec {
		s = strconv.FormatFloat(f, 'e', prec-1, 64)
		if !alt {
			mant, ex, _ := strings.Cut(s, "e")
			if strings.Contains(mant, ".") {
				mant = strings.TrimRight(strings.TrimRight(mant, "0"), ".")
			}
			s = mant + "e" + ex
		}
	} else {
		s = strconv.FormatFloat(f, 'f', prec-1-exp, 64)
		if !alt && strings.Contains(s, ".") {
			s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
		}
	}
	if conv == 'G' {
		s = strings.ToUpper(s)
	}
	return s
}
