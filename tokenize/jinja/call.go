package jinja

// Calls: argument evaluation, builtins, methods, macros (with caller and varargs) and
// the loop object.

import (
	"fmt"
	"math"
	"math/big"
)

func (e *evaluator) evalArgs(a *callArgs, s *scope) ([]Value, kwargs, error) {
	var kw kwargs
	var args []Value
	if len(a.pos) > 0 {
		args = make([]Value, 0, len(a.pos))
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
		items, err := iterate(v)
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
		if v.k != KindDict {
			return nil, kw, errorf("TypeError", "argument after ** must be a mapping, not %s", v.TypeName())
		}
		d := v.dict()
		for i, k := range d.keys {
			if k.k != KindString {
				return nil, kw, errorf("TypeError", "keywords must be strings")
			}
			kw.names = append(kw.names, k.s)
			kw.vals = append(kw.vals, d.vals[i])
		}
	}
	return args, kw, nil
}

func (e *evaluator) evalCall(t *callExpr, s *scope) (Value, error) {
	// obj.method(...) without materialising a bound method
	if ga, ok := t.fn.(*getattrExpr); ok {
		obj, err := e.eval(ga.obj, s)
		if err != nil {
			return Value{}, err
		}
		if m := directMethod(obj, ga.name); m != nil {
			args, kw, err := e.evalArgs(&t.args, s)
			if err != nil {
				return Value{}, err
			}
			return m(e, obj, args, kw)
		}
		fn, err := e.getattr(obj, ga.name)
		if err != nil {
			return Value{}, err
		}
		args, kw, err := e.evalArgs(&t.args, s)
		if err != nil {
			return Value{}, err
		}
		return e.call(fn, args, kw)
	}
	fn, err := e.eval(t.fn, s)
	if err != nil {
		return Value{}, err
	}
	args, kw, err := e.evalArgs(&t.args, s)
	if err != nil {
		return Value{}, err
	}
	return e.call(fn, args, kw)
}

// methodFunc implements a Python method of a builtin type.
type methodFunc func(e *evaluator, recv Value, args []Value, kw kwargs) (Value, error)

// directMethod returns the method obj.name when attribute lookup would find one.
func directMethod(obj Value, name string) methodFunc {
	switch obj.k {
	case KindString:
		return strMethods[name]
	case KindDict:
		if dictMethods[name] {
			return dictMethodFuncs[name]
		}
	case KindList, kindTuple:
		if listMethods[name] && !(obj.k == kindTuple && name == "copy") {
			return listMethodFuncs[name]
		}
	}
	return nil
}

func (e *evaluator) call(fn Value, args []Value, kw kwargs) (Value, error) {
	switch fn.k {
	case KindUndefined:
		return Value{}, undefinedError(fn)
	case kindFunc:
	case kindCycler, kindJoiner:
		if fn.k == kindJoiner {
			j := fn.o.(*joinerState)
			if !j.used {
				j.used = true
				return emptyString, nil
			}
			return StringValue(j.sep), nil
		}
		return Value{}, errorf("TypeError", "'Cycler' object is not callable")
	case kindLoop:
		l := fn.o.(*loopContext)
		if !l.node.recursive {
			return Value{}, errorf("TypeError", "The loop must be marked as 'recursive' to call it.")
		}
		if len(args) != 1 || len(kw.names) > 0 {
			return Value{}, errorf("TypeError", "loop() takes exactly one argument")
		}
		if e.depth >= maxCallDepth {
			return Value{}, errorf("RecursionError", "maximum recursion depth exceeded")
		}
		e.depth++
		start := len(e.buf)
		err := e.execFor(l.node, args[0], l.scope, l.depth0+1)
		out := string(e.buf[start:])
		e.buf = e.buf[:start]
		e.depth--
		if err != nil {
			return Value{}, err
		}
		return StringValue(out), nil
	default:
		return Value{}, errorf("TypeError", "'%s' object is not callable", fn.TypeName())
	}
	c := fn.o.(*callable)
	switch {
	case c.fn != nil:
		return c.fn(e, args, kw)
	case c.macro != nil:
		return e.callMacro(c, args, kw)
	case c.method != "":
		return e.callMethod(c.recv, c.method, args, kw)
	}
	return Value{}, errorf("TypeError", "'%s' object is not callable", c.name)
}

func (e *evaluator) callMethod(recv Value, name string, args []Value, kw kwargs) (Value, error) {
	if m := directMethod(recv, name); m != nil {
		return m(e, recv, args, kw)
	}
	switch recv.k {
	case kindCycler:
		c := recv.o.(*cyclerState)
		switch name {
		case "next":
			v := c.items[c.pos]
			c.pos = (c.pos + 1) % len(c.items)
			return v, nil
		case "reset":
			c.pos = 0
			return noneValue, nil
		}
	case kindLoop:
		return e.loopMethod(recv.o.(*loopContext), name, args, kw)
	case KindFloat:
		switch name {
		case "is_integer":
			return BoolValue(recv.f == math.Trunc(recv.f) && !math.IsInf(recv.f, 0)), nil
		case "conjugate":
			return recv, nil
		}
	case KindInt, kindBig, KindBool:
		switch name {
		case "bit_length":
			return intValue(int64(new(big.Int).Abs(bigOf(recv)).BitLen())), nil
		case "conjugate":
			return intValue(recv.n), nil
		}
	}
	return Value{}, errorf("TypeError", "method %s.%s is not supported", recv.TypeName(), name)
}

func (e *evaluator) callMacro(c *callable, args []Value, kw kwargs) (Value, error) {
	m := c.macro
	if err := e.step(); err != nil {
		return Value{}, err
	}
	if e.depth >= maxCallDepth {
		return Value{}, errorf("RecursionError", "maximum recursion depth exceeded")
	}
	inner := &scope{parent: c.scope}
	nParams := len(m.params)
	values := make([]Value, nParams)
	for i := range values {
		values[i] = Value{k: kindMissing}
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
	var caller Value
	callerSet := false
	var extra kwargs
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
				return Value{}, errorf("TypeError", "macro '%s' was invoked with two values for the special caller argument. This is most likely a bug.", m.name)
			}
		}
		return Value{}, errorf("TypeError", "macro '%s' takes no keyword argument '%s'", m.name, extra.names[0])
	}
	if !m.catchVarargs && len(args) > nParams {
		return Value{}, errorf("TypeError", "macro '%s' takes not more than %d argument(s)", m.name, nParams)
	}
	firstDefault := nParams - len(m.defaults)
	for i, p := range m.params {
		v := values[i]
		if v.k == kindMissing {
			if i >= firstDefault {
				var err error
				if v, err = e.eval(m.defaults[i-firstDefault], inner); err != nil {
					return Value{}, err
				}
			} else {
				v = undefinedHinted(fmt.Sprintf("parameter %s was not provided", pyQuote(p)), false)
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
			caller = undefinedHinted("No caller defined", false)
		}
		inner.set("caller", caller)
	}
	if m.catchKwargs {
		d := NewDict(len(extra.names))
		for i, n := range extra.names {
			d.set(StringValue(n), extra.vals[i])
		}
		inner.set("kwargs", DictValue(d))
	}
	if m.catchVarargs {
		var rest []Value
		if len(args) > nParams {
			rest = append(rest, args[nParams:]...)
		}
		inner.set("varargs", tupleValue(rest))
	}
	e.depth++
	out, err := e.capture(m.body, inner)
	e.depth--
	if err != nil {
		return Value{}, err
	}
	return StringValue(out), nil
}

// ---- loop object ----

func (e *evaluator) loopAttr(l *loopContext, self Value, name string) (Value, bool) {
	n := len(l.items)
	switch name {
	case "index":
		return intValue(int64(l.index0 + 1)), true
	case "index0":
		return intValue(int64(l.index0)), true
	case "revindex":
		return intValue(int64(n - l.index0)), true
	case "revindex0":
		return intValue(int64(n - l.index0 - 1)), true
	case "first":
		return BoolValue(l.index0 == 0), true
	case "last":
		return BoolValue(l.index0 == n-1), true
	case "length":
		return intValue(int64(n)), true
	case "depth":
		return intValue(int64(l.depth0 + 1)), true
	case "depth0":
		return intValue(int64(l.depth0)), true
	case "previtem":
		if l.index0 > 0 {
			return l.items[l.index0-1], true
		}
		return undefinedHinted("there is no previous item", false), true
	case "nextitem":
		if l.index0+1 < n {
			return l.items[l.index0+1], true
		}
		return undefinedHinted("there is no next item", false), true
	case "cycle", "changed":
		return boundMethod(self, name), true
	}
	return Value{}, false
}

func (e *evaluator) loopMethod(l *loopContext, name string, args []Value, kw kwargs) (Value, error) {
	switch name {
	case "cycle":
		if len(args) == 0 {
			return Value{}, errorf("TypeError", "no items for cycling given")
		}
		return args[l.index0%len(args)], nil
	case "changed":
		if l.changedSet && len(l.changedLast) == len(args) {
			same := true
			for i := range args {
				if !equal(args[i], l.changedLast[i]) {
					same = false
					break
				}
			}
			if same {
				return falseValue, nil
			}
		}
		l.changedLast = append([]Value(nil), args...)
		l.changedSet = true
		return trueValue, nil
	}
	return Value{}, errorf("TypeError", "'LoopContext' object has no method %s", name)
}
