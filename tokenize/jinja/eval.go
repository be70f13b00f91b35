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

func errorf(kind, format string, args ...any) *Error {
	return &Error{Type: kind, Message: fmt.Sprintf(format, args...)}
}

const kindMissing Kind = 255 // an argument that was not passed

// maxCallDepth bounds macro recursion (Python would raise RecursionError).
const maxCallDepth = 200

// maxOutput bounds the rendered size (and any string) so a hostile template/request
// cannot exhaust memory; maxItems bounds lists built by concatenation or repetition.
const (
	maxOutput = 64 << 20
	maxItems  = 1 << 22
)

type scope struct {
	parent *scope
	names  []string
	vals   []Value
}

func (s *scope) lookup(name string) (Value, bool) {
	for sc := s; sc != nil; sc = sc.parent {
		for i := len(sc.names) - 1; i >= 0; i-- {
			if sc.names[i] == name {
				return sc.vals[i], true
			}
		}
	}
	return Value{}, false
}

func (s *scope) set(name string, v Value) {
	for i := len(s.names) - 1; i >= 0; i-- {
		if s.names[i] == name {
			s.vals[i] = v
			return
		}
	}
	s.names = append(s.names, name)
	s.vals = append(s.vals, v)
}

// kwargs holds keyword arguments in call order.
type kwargs struct {
	names []string
	vals  []Value
}

func (k kwargs) get(name string) (Value, bool) {
	for i, n := range k.names {
		if n == name {
			return k.vals[i], true
		}
	}
	return Value{}, false
}

type builtin func(e *evaluator, args []Value, kw kwargs) (Value, error)

type callable struct {
	name  string
	fn    builtin
	macro *macro
	scope *scope // the scope a macro was defined in
	// bound method (an attribute read without a call)
	recv   Value
	method string
}

type loopContext struct {
	items       []Value
	index0      int
	depth0      int
	changedLast []Value
	changedSet  bool
	node        *forStmt
	scope       *scope
}

type cyclerState struct {
	items []Value
	pos   int
}

type joinerState struct {
	sep  string
	used bool
}

type control uint8

const (
	ctlNone control = iota
	ctlBreak
	ctlContinue
)

// evaluator is the state of one render.
type evaluator struct {
	buf   []byte
	depth int
	steps int
	now   func() time.Time
	// vars holds the render's variables (parent: the globals) and root, their child,
	// the names the template assigns at top level; kept here to save allocations.
	vars, root scope
}

// maxSteps bounds loop iterations and macro calls per render, so that no template and
// request can keep a gateway busy indefinitely (real chat templates need a few thousand).
const maxSteps = 5_000_000

func (e *evaluator) step() error {
	e.steps++
	if e.steps > maxSteps {
		return errorf("RuntimeError", "template execution exceeded %d steps", maxSteps)
	}
	return nil
}

func (e *evaluator) write(s string) error {
	e.buf = append(e.buf, s...)
	if len(e.buf) > maxOutput {
		return errorf("MemoryError", "rendered template exceeds %d bytes", maxOutput)
	}
	return nil
}

// capture renders body into a string without writing it to the output.
func (e *evaluator) capture(body []stmt, s *scope) (string, error) {
	start := len(e.buf)
	_, err := e.execBody(body, s)
	out := string(e.buf[start:])
	e.buf = e.buf[:start]
	return out, err
}

func (e *evaluator) execBody(body []stmt, s *scope) (control, error) {
	for _, n := range body {
		ctl, err := e.exec(n, s)
		if err != nil || ctl != ctlNone {
			return ctl, err
		}
	}
	return ctlNone, nil
}

func (e *evaluator) exec(n stmt, s *scope) (control, error) {
	switch x := n.(type) {
	case *dataStmt:
		return ctlNone, e.write(x.s)
	case *outputStmt:
		return ctlNone, e.output(x.e, s)
	case *ifStmt:
		for i, t := range x.tests {
			v, err := e.eval(t, s)
			if err != nil {
				return ctlNone, err
			}
			if err := checkBool(v); err != nil {
				return ctlNone, err
			}
			if v.Truth() {
				return e.execBody(x.bodies[i], s)
			}
		}
		return e.execBody(x.els, s)
	case *forStmt:
		v, err := e.eval(x.iter, s)
		if err != nil {
			return ctlNone, err
		}
		return ctlNone, e.execFor(x, v, s, 0)
	case *setStmt:
		v, err := e.eval(x.e, s)
		if err != nil {
			return ctlNone, err
		}
		return ctlNone, e.assign(x.target, v, s)
	case *setBlockStmt:
		out, err := e.capture(x.body, s)
		if err != nil {
			return ctlNone, err
		}
		v := StringValue(out)
		if x.filter != nil {
			if v, err = e.applyFilterChain(x.filter, v, s); err != nil {
				return ctlNone, err
			}
		}
		return ctlNone, e.assign(x.target, v, s)
	case *macroStmt:
		s.set(x.m.name, Value{k: kindFunc, o: &callable{name: x.m.name, macro: x.m, scope: s}})
		return ctlNone, nil
	case *callBlockStmt:
		caller := Value{k: kindFunc, o: &callable{name: "caller", macro: x.caller, scope: s}}
		fn, err := e.eval(x.call.fn, s)
		if err != nil {
			return ctlNone, err
		}
		args, kw, err := e.evalArgs(&x.call.args, s)
		if err != nil {
			return ctlNone, err
		}
		kw.names = append(kw.names, "caller")
		kw.vals = append(kw.vals, caller)
		v, err := e.call(fn, args, kw)
		if err != nil {
			return ctlNone, err
		}
		return ctlNone, e.write(v.String())
	case *filterBlockStmt:
		out, err := e.capture(x.body, s)
		if err != nil {
			return ctlNone, err
		}
		v, err := e.applyFilterChain(x.filter, StringValue(out), s)
		if err != nil {
			return ctlNone, err
		}
		return ctlNone, e.write(v.String())
	case *withStmt:
		inner := &scope{parent: s}
		for i, t := range x.targets {
			v, err := e.eval(x.vals[i], s)
			if err != nil {
				return ctlNone, err
			}
			if err := e.assign(t, v, inner); err != nil {
				return ctlNone, err
			}
		}
		return e.execBody(x.body, inner)
	case *breakStmt:
		return ctlBreak, nil
	case *continueStmt:
		return ctlContinue, nil
	case *blockStmt:
		return e.execBody(x.body, &scope{parent: s})
	case *generationStmt:
		return e.execBody(x.body, s)
	case *unsupportedStmt:
		return ctlNone, errorf("TypeError", "%s", x.msg)
	}
	return ctlNone, fmt.Errorf("internal: unknown statement %T", n)
}

// checkBool is a hook for truth tests that raise; jinja2's Undefined.__bool__ never
// does (not even the sandbox's unsafe Undefined), so nothing fails here.
func checkBool(Value) error { return nil }

// output writes {{ expr }}. Chains of + over strings and ~ concatenations are written
// piecewise instead of building intermediate strings.
func (e *evaluator) output(x expr, s *scope) error {
	switch t := x.(type) {
	case *constExpr:
		return e.write(t.v.String())
	case *concatExpr:
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
	case *binExpr:
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

func (e *evaluator) writeValue(v Value) error {
	if v.k == KindString {
		return e.write(v.s)
	}
	var b strings.Builder
	writeStr(&b, v)
	return e.write(b.String())
}

// addChain evaluates a left-associative chain of + operators. While all operands are
// strings they are concatenated (or, when direct, written to the output: ok=true);
// from the first non-string operand on, Python's pairwise semantics apply.
func (e *evaluator) addChain(x *binExpr, s *scope, direct bool) (Value, bool, error) {
	var ops [16]expr
	chain := ops[:0]
	var cur expr = x
	for {
		b, ok := cur.(*binExpr)
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
		return Value{}, false, err
	}
	if first.k != KindString {
		acc, err := e.addRest(first, chain[:len(chain)-1], s)
		return acc, false, err
	}
	if direct {
		start := len(e.buf)
		if err := e.write(first.s); err != nil {
			return Value{}, false, err
		}
		for i := len(chain) - 2; i >= 0; i-- {
			r, err := e.eval(chain[i], s)
			if err != nil {
				e.buf = e.buf[:start]
				return Value{}, false, err
			}
			if r.k != KindString {
				acc := StringValue(string(e.buf[start:]))
				e.buf = e.buf[:start]
				if acc, err = add(acc, r); err != nil {
					return Value{}, false, err
				}
				acc, err = e.addRest(acc, chain[:i], s)
				return acc, false, err
			}
			if err := e.write(r.s); err != nil {
				return Value{}, false, err
			}
		}
		return Value{}, true, nil
	}
	var parts [16]string
	strs := append(parts[:0], first.s)
	n := len(first.s)
	for i := len(chain) - 2; i >= 0; i-- {
		r, err := e.eval(chain[i], s)
		if err != nil {
			return Value{}, false, err
		}
		if r.k != KindString {
			acc := StringValue(strings.Join(strs, ""))
			if acc, err = add(acc, r); err != nil {
				return Value{}, false, err
			}
			acc, err = e.addRest(acc, chain[:i], s)
			return acc, false, err
		}
		strs = append(strs, r.s)
		n += len(r.s)
		if n > maxOutput {
			return Value{}, false, errorf("MemoryError", "string too large")
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
	return StringValue(b.String()), false, nil
}

// addRest adds the operands of rest (reversed, as chain is: the last
// element is the next operand) to acc one by one, left to right.
func (e *evaluator) addRest(acc Value, rest []expr, s *scope) (Value, error) {
	for i := len(rest) - 1; i >= 0; i-- {
		r, err := e.eval(rest[i], s)
		if err != nil {
			return Value{}, err
		}
		if acc, err = add(acc, r); err != nil {
			return Value{}, err
		}
	}
	return acc, nil
}

// ---- for loops ----

func (e *evaluator) execFor(x *forStmt, iterable Value, s *scope, depth0 int) error {
	items, err := iterate(iterable)
	if err != nil {
		return err
	}
	if x.cond != nil {
		var kept []Value
		for _, it := range items {
			inner := &scope{parent: s}
			if err := e.assign(x.target, it, inner); err != nil {
				return err
			}
			c, err := e.eval(x.cond, inner)
			if err != nil {
				return err
			}
			if c.Truth() {
				kept = append(kept, it)
			}
		}
		items = kept
	}
	if len(items) == 0 {
		_, err := e.execBody(x.els, s)
		return err
	}
	loop := &loopContext{items: items, depth0: depth0, node: x, scope: s}
	loopV := Value{k: kindLoop, o: loop}
	var inner *scope
	for i, it := range items {
		if err := e.step(); err != nil {
			return err
		}
		loop.index0 = i
		if inner == nil || x.fresh {
			inner = &scope{parent: s}
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
		if ctl == ctlBreak {
			break
		}
	}
	return nil
}

// assign binds a target in scope s (tuple targets unpack like Python).
func (e *evaluator) assign(t *target, v Value, s *scope) error {
	if t.attr != "" {
		nsv, _ := s.lookup(t.name)
		if nsv.k != kindNamespace {
			return errorf("TemplateRuntimeError", "cannot assign attribute on non-namespace object")
		}
		nsv.o.(*namespace).set(t.attr, v)
		return nil
	}
	if !t.tuple {
		s.set(t.name, v)
		return nil
	}
	items, err := iterate(v)
	if err != nil {
		if v.k != KindUndefined {
			return errorf("TypeError", "cannot unpack non-iterable %s object", v.TypeName())
		}
		return err
	}
	if len(items) < len(t.elems) {
		return errorf("ValueError", "not enough values to unpack (expected %d, got %d)", len(t.elems), len(items))
	}
	if len(items) > len(t.elems) {
		return errorf("ValueError", "too many values to unpack (expected %d)", len(t.elems))
	}
	for i, el := range t.elems {
		if err := e.assign(el, items[i], s); err != nil {
			return err
		}
	}
	return nil
}
