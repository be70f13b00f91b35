package jinja

// Tests ({% if x is defined %}): jinja2's tests.py.

func testBoolean(_ *evaluator, v Value, _ []Value, _ kwargs) (bool, error) {
	return v.k == KindBool, nil
}

func testCallable(_ *evaluator, v Value, _ []Value, _ kwargs) (bool, error) {
	switch v.k {
	case kindFunc, KindUndefined, kindJoiner, kindLoop:
		return true, nil
	}
	return false, nil
}

func testCmp(op string) testFunc {
	return func(_ *evaluator, v Value, args []Value, kw kwargs) (bool, error) {
		a, err := bind(op, []string{"other"}, args, kw)
		if err != nil {
			return false, err
		}
		if a[0].k == kindMissing {
			return false, errorf("TypeError", "test '%s' requires an argument", op)
		}
		return compareOp(op, v, a[0])
	}
}

func testDivisibleby(_ *evaluator, v Value, args []Value, kw kwargs) (bool, error) {
	a, err := bind("divisibleby", []string{"num"}, args, kw)
	if err != nil {
		return false, err
	}
	r, err := binaryOp("%", v, a[0])
	if err != nil {
		return false, err
	}
	return equal(r, intValue(0)), nil
}

func testEven(_ *evaluator, v Value, _ []Value, _ kwargs) (bool, error) {
	r, err := binaryOp("%", v, intValue(2))
	if err != nil {
		return false, err
	}
	return equal(r, intValue(0)), nil
}

func testOdd(_ *evaluator, v Value, _ []Value, _ kwargs) (bool, error) {
	r, err := binaryOp("%", v, intValue(2))
	if err != nil {
		return false, err
	}
	return equal(r, intValue(1)), nil
}

func testFilter(_ *evaluator, v Value, _ []Value, _ kwargs) (bool, error) {
	return v.k == KindString && filters[v.s] != nil, nil
}

func testTest(_ *evaluator, v Value, _ []Value, _ kwargs) (bool, error) {
	return v.k == KindString && tests[v.s] != nil, nil
}

func testIn(_ *evaluator, v Value, args []Value, kw kwargs) (bool, error) {
	a, err := bind("in", []string{"seq"}, args, kw)
	if err != nil {
		return false, err
	}
	return contains(a[0], v)
}

func testIterable(_ *evaluator, v Value, _ []Value, _ kwargs) (bool, error) {
	switch v.k {
	case KindString, KindList, kindTuple, KindDict, KindUndefined, kindLoop, kindGenerator, kindView:
		return true, nil
	}
	return false, nil
}

func testSequence(_ *evaluator, v Value, _ []Value, _ kwargs) (bool, error) {
	switch v.k {
	case KindString, KindList, kindTuple, KindDict, KindUndefined:
		return true, nil
	}
	return false, nil
}

func testLower(_ *evaluator, v Value, _ []Value, _ kwargs) (bool, error) {
	return pyIsLower(softStr(v)), nil
}

func testUpper(_ *evaluator, v Value, _ []Value, _ kwargs) (bool, error) {
	return pyIsUpper(softStr(v)), nil
}

func testSameas(_ *evaluator, v Value, args []Value, kw kwargs) (bool, error) {
	a, err := bind("sameas", []string{"other"}, args, kw)
	if err != nil {
		return false, err
	}
	o := a[0]
	if v.k != o.k {
		return false, nil
	}
	switch v.k {
	case KindNone, KindUndefined:
		return v.k == KindNone, nil
	case KindBool, KindInt:
		return v.n == o.n, nil
	case KindString:
		return v.s == o.s, nil
	case KindFloat:
		return false, nil
	}
	return v.o == o.o, nil
}
