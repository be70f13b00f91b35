package jinja

// Evaluator: statements and scoping with the semantics of jinja2 3.1 compiled templates
// in an ImmutableSandboxedEnvironment.
//
// Scoping follows jinja2: {% if %} does not open a scope; every {% for %} iteration,
// macro call, {% with %} and {% block %} does. Names assigned inside a loop body are
// local to that iteration (a loop cannot change an outer variable except through a
// namespace); macros see the variables of the scope they were defined in at call time.

import (
	"fmt"
	"strings"
	"time"
)

// Error is a Python exception a template raises while rendering: one of jinja2's or
// Python's (Type "UndefinedError", "TypeError", "SecurityError", ...) or the template's
// own raise_exception(message) (Type "TemplateError").
type Error struct {
	Type    string // the Python exception type
	Message string
}

func (e *Error) Error() string { return e.Message }

func jErrorf(kind, format string, args ...any) *Error {
	return &Error{Type: kind, Message: fmt.Sprintf(format, args...)}
}

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

// jEval is the state of one render.
type jEval struct {
	buf   []byte
	depth int
	steps int
	now   func() time.Time
	// vars holds the render's variables (parent: the globals) and root, their child,
	// the names the template assigns at top level; kept here to save allocations.
	vars, root jScope
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
