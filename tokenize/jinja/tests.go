package jinja

// Tests ({% if x is defined %}): jinja2's tests.py.

func jtBoolean(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) { return v.k == jkBool, nil }

func jtCallable(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) {
	switch v.k {
	case jkFunc, jkUndef, jkJoiner, jkLoop:
		return true, nil
	}
	return false, nil
}

func jtCmp(op string) jTestFn {
	return func(_ *jEval, v jv, args []jv, kw jKw) (bool, error) {
		a, err := jBind(op, []string{"other"}, args, kw)
		if err != nil {
			return false, err
		}
		if a[0].k == jkMissing {
			return false, jErrorf("TypeError", "test '%s' requires an argument", op)
		}
		return jCompareOp(op, v, a[0])
	}
}

func jtDivisibleby(_ *jEval, v jv, args []jv, kw jKw) (bool, error) {
	a, err := jBind("divisibleby", []string{"num"}, args, kw)
	if err != nil {
		return false, err
	}
	r, err := jBinary("%", v, a[0])
	if err != nil {
		return false, err
	}
	return jEqual(r, jIntV(0)), nil
}

func jtEven(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) {
	r, err := jBinary("%", v, jIntV(2))
	if err != nil {
		return false, err
	}
	return jEqual(r, jIntV(0)), nil
}

func jtOdd(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) {
	r, err := jBinary("%", v, jIntV(2))
	if err != nil {
		return false, err
	}
	return jEqual(r, jIntV(1)), nil
}

func jtFilter(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) {
	return v.k == jkStr && jFilters[v.s] != nil, nil
}

func jtTest(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) {
	return v.k == jkStr && jTests[v.s] != nil, nil
}

func jtIn(_ *jEval, v jv, args []jv, kw jKw) (bool, error) {
	a, err := jBind("in", []string{"seq"}, args, kw)
	if err != nil {
		return false, err
	}
	return jContains(a[0], v)
}

func jtIterable(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) {
	switch v.k {
	case jkStr, jkList, jkTuple, jkDict, jkUndef, jkLoop, jkGen, jkView:
		return true, nil
	}
	return false, nil
}

func jtSequence(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) {
	switch v.k {
	case jkStr, jkList, jkTuple, jkDict, jkUndef:
		return true, nil
	}
	return false, nil
}

func jtLower(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) {
	return jIsLowerStr(jSoftStr(v)), nil
}

func jtUpper(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) {
	return jIsUpperStr(jSoftStr(v)), nil
}

func jtSameas(_ *jEval, v jv, args []jv, kw jKw) (bool, error) {
	a, err := jBind("sameas", []string{"other"}, args, kw)
	if err != nil {
		return false, err
	}
	o := a[0]
	if v.k != o.k {
		return false, nil
	}
	switch v.k {
	case jkNone, jkUndef:
		return v.k == jkNone, nil
	case jkBool, jkInt:
		return v.n == o.n, nil
	case jkStr:
		return v.s == o.s, nil
	case jkFloat:
		return false, nil
	}
	return v.o == o.o, nil
}
