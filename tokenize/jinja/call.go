package jinja

// Calls: argument evaluation, builtins, methods, macros (with caller and varargs) and
// the loop object.

import (
	"fmt"
	"math"
	"math/big"
)

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
