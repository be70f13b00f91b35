package jinja

// Expressions: jinja2.parser.Parser's expression grammar (precedence climbing from
// conditional expressions down to primaries, then postfix subscripts, calls, filters
// and tests).

func (p *parser) parseExpression(withCondExpr bool) (expr, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > maxNesting {
		return nil, p.fail("expression nesting too deep")
	}
	if withCondExpr {
		return p.parseCondExpr()
	}
	return p.parseOr()
}

func (p *parser) parseCondExpr() (expr, error) {
	e1, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	for p.skipName("if") {
		p.soft++
		e2, err := p.parseOr()
		if err != nil {
			p.soft--
			return nil, err
		}
		var e3 expr
		if p.skipName("else") {
			if e3, err = p.parseCondExpr(); err != nil {
				p.soft--
				return nil, err
			}
		}
		p.soft--
		e1 = &condExpr{test: e2, yes: e1, no: e3}
	}
	return e1, nil
}

func (p *parser) parseOr() (expr, error) {
	l, err := p.parseAnd()
	if err != nil {
		return nil, err
	}
	for p.skipName("or") {
		r, err := p.parseAnd()
		if err != nil {
			return nil, err
		}
		l = &orExpr{l: l, r: r}
	}
	return l, nil
}

func (p *parser) parseAnd() (expr, error) {
	l, err := p.parseNot()
	if err != nil {
		return nil, err
	}
	for p.skipName("and") {
		r, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		l = &andExpr{l: l, r: r}
	}
	return l, nil
}

func (p *parser) parseNot() (expr, error) {
	if p.skipName("not") {
		p.depth++
		defer func() { p.depth-- }()
		if p.depth > maxNesting {
			return nil, p.fail("expression nesting too deep")
		}
		e, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		return &notExpr{e: e}, nil
	}
	return p.parseCompare()
}

func (p *parser) parseCompare() (expr, error) {
	e, err := p.parseMath1()
	if err != nil {
		return nil, err
	}
	var ops []string
	var rest []expr
	for {
		t := p.cur()
		op := ""
		switch {
		case t.t == tokOp && (t.s == "==" || t.s == "!=" || t.s == ">" || t.s == ">=" || t.s == "<" || t.s == "<="):
			p.next()
			op = t.s
		case t.t == tokName && t.s == "in":
			p.next()
			op = "in"
		case t.t == tokName && t.s == "not" && p.look().t == tokName && p.look().s == "in":
			p.next()
			p.next()
			op = "notin"
		default:
			if len(ops) == 0 {
				return e, nil
			}
			return &compareExpr{first: e, ops: ops, rest: rest}, nil
		}
		r, err := p.parseMath1()
		if err != nil {
			return nil, err
		}
		ops = append(ops, op)
		rest = append(rest, r)
	}
}

func (p *parser) parseMath1() (expr, error) {
	l, err := p.parseConcat()
	if err != nil {
		return nil, err
	}
	for p.isOp("+") || p.isOp("-") {
		op := p.next().s
		r, err := p.parseConcat()
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: op, l: l, r: r}
	}
	return l, nil
}

func (p *parser) parseConcat() (expr, error) {
	e, err := p.parseMath2()
	if err != nil {
		return nil, err
	}
	if !p.isOp("~") {
		return e, nil
	}
	args := []expr{e}
	for p.skipOp("~") {
		e, err := p.parseMath2()
		if err != nil {
			return nil, err
		}
		args = append(args, e)
	}
	return &concatExpr{args: args}, nil
}

func (p *parser) parseMath2() (expr, error) {
	l, err := p.parsePow()
	if err != nil {
		return nil, err
	}
	for p.isOp("*") || p.isOp("/") || p.isOp("//") || p.isOp("%") {
		op := p.next().s
		r, err := p.parsePow()
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: op, l: l, r: r}
	}
	return l, nil
}

func (p *parser) parsePow() (expr, error) {
	l, err := p.parseUnary(true)
	if err != nil {
		return nil, err
	}
	for p.skipOp("**") {
		r, err := p.parseUnary(true)
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: "**", l: l, r: r}
	}
	return l, nil
}

func (p *parser) parseUnary(withFilter bool) (expr, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > maxNesting {
		return nil, p.fail("expression nesting too deep")
	}
	var e expr
	var err error
	switch {
	case p.isOp("-"):
		p.next()
		inner, err := p.parseUnary(false)
		if err != nil {
			return nil, err
		}
		e = &negExpr{e: inner}
	case p.isOp("+"):
		p.next()
		inner, err := p.parseUnary(false)
		if err != nil {
			return nil, err
		}
		e = &posExpr{e: inner}
	default:
		if e, err = p.parsePrimary(); err != nil {
			return nil, err
		}
	}
	if e, err = p.parsePostfix(e); err != nil {
		return nil, err
	}
	if withFilter {
		return p.parseFilterExpr(e)
	}
	return e, nil
}

func (p *parser) parsePrimary() (expr, error) {
	t := p.cur()
	switch t.t {
	case tokName:
		p.next()
		switch t.s {
		case "true", "True":
			return &constExpr{v: trueValue}, nil
		case "false", "False":
			return &constExpr{v: falseValue}, nil
		case "none", "None":
			return &constExpr{v: noneValue}, nil
		}
		return &nameExpr{name: t.s}, nil
	case tokString:
		p.next()
		s := t.s
		for p.cur().t == tokString {
			s += p.next().s
		}
		return &constExpr{v: StringValue(s)}, nil
	case tokInt, tokFloat:
		p.next()
		return &constExpr{v: t.v}, nil
	case tokOp:
		switch t.s {
		case "(":
			p.next()
			e, err := p.parseTuple(false, true, nil, true)
			if err != nil {
				return nil, err
			}
			if err := p.expectOp(")"); err != nil {
				return nil, err
			}
			return e, nil
		case "[":
			return p.parseList()
		case "{":
			return p.parseDict()
		}
	}
	return nil, p.fail("unexpected '%s'", t.describe())
}

func (p *parser) isTupleEnd(extraEnd []string) bool {
	t := p.cur()
	switch t.t {
	case tokVarEnd, tokBlockEnd:
		return true
	case tokOp:
		return t.s == ")"
	case tokName:
		for _, e := range extraEnd {
			if t.s == e {
				return true
			}
		}
	case tokEOF:
		return true
	}
	return false
}

// parseTuple mirrors Parser.parse_tuple.
func (p *parser) parseTuple(simplified, withCondExpr bool, extraEnd []string, explicitParens bool) (expr, error) {
	var items []expr
	isTuple := false
	for {
		if len(items) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		if p.isTupleEnd(extraEnd) {
			break
		}
		var e expr
		var err error
		switch {
		case simplified:
			e, err = p.parsePrimary()
		default:
			e, err = p.parseExpression(withCondExpr)
		}
		if err != nil {
			return nil, err
		}
		items = append(items, e)
		if p.isOp(",") {
			isTuple = true
		} else {
			break
		}
	}
	if !isTuple {
		if len(items) > 0 {
			return items[0], nil
		}
		if !explicitParens {
			return nil, p.fail("Expected an expression, got '%s'", p.cur().describe())
		}
	}
	return &tupleExpr{items: items}, nil
}

func (p *parser) parseList() (expr, error) {
	p.next() // [
	l := &listExpr{}
	for !p.isOp("]") {
		if len(l.items) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		if p.isOp("]") {
			break
		}
		e, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		l.items = append(l.items, e)
	}
	p.next()
	return l, nil
}

func (p *parser) parseDict() (expr, error) {
	p.next() // {
	d := &dictExpr{}
	for !p.isOp("}") {
		if len(d.keys) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		if p.isOp("}") {
			break
		}
		k, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		if err := p.expectOp(":"); err != nil {
			return nil, err
		}
		v, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		d.keys = append(d.keys, k)
		d.vals = append(d.vals, v)
	}
	p.next()
	return d, nil
}

func (p *parser) parsePostfix(e expr) (expr, error) {
	for {
		var err error
		switch {
		case p.isOp(".") || p.isOp("["):
			e, err = p.parseSubscript(e)
		case p.isOp("("):
			e, err = p.parseCall(e)
		default:
			return e, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

func (p *parser) parseFilterExpr(e expr) (expr, error) {
	for {
		var err error
		switch {
		case p.isOp("|"):
			e, err = p.parseFilter(e, false)
		case p.isName("is"):
			e, err = p.parseTest(e)
		case p.isOp("("):
			e, err = p.parseCall(e)
		default:
			return e, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

func (p *parser) parseSubscript(e expr) (expr, error) {
	t := p.next()
	if t.s == "." {
		a := p.cur()
		p.next()
		switch a.t {
		case tokName:
			return &getattrExpr{obj: e, name: a.s}, nil
		case tokInt:
			return &getitemExpr{obj: e, key: &constExpr{v: a.v}}, nil
		}
		return nil, p.fail("expected name or number")
	}
	// [
	var args []expr
	for !p.isOp("]") {
		if len(args) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		a, err := p.parseSubscribed()
		if err != nil {
			return nil, err
		}
		args = append(args, a)
	}
	p.next()
	switch len(args) {
	case 0:
		return nil, p.fail("expected subscript expression")
	case 1:
		return &getitemExpr{obj: e, key: args[0]}, nil
	}
	return &getitemExpr{obj: e, key: &tupleExpr{items: args}}, nil
}

func (p *parser) parseSubscribed() (expr, error) {
	var args []expr
	if p.isOp(":") {
		p.next()
		args = []expr{nil}
	} else {
		e, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		if !p.isOp(":") {
			return e, nil
		}
		p.next()
		args = []expr{e}
	}
	switch {
	case p.isOp(":"):
		args = append(args, nil)
	case !p.isOp("]") && !p.isOp(","):
		e, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		args = append(args, e)
	default:
		args = append(args, nil)
	}
	if p.skipOp(":") {
		if !p.isOp("]") && !p.isOp(",") {
			e, err := p.parseExpression(true)
			if err != nil {
				return nil, err
			}
			args = append(args, e)
		} else {
			args = append(args, nil)
		}
	} else {
		args = append(args, nil)
	}
	return &sliceExpr{start: args[0], stop: args[1], step: args[2]}, nil
}

func (p *parser) parseCallArgs() (callArgs, error) {
	var a callArgs
	if err := p.expectOp("("); err != nil {
		return a, err
	}
	requireComma := false
	for !p.isOp(")") {
		if requireComma {
			if err := p.expectOp(","); err != nil {
				return a, err
			}
			if p.isOp(")") {
				break
			}
		}
		switch {
		case p.isOp("*"):
			if a.dynArgs != nil || a.dynKw != nil {
				return a, p.fail("invalid syntax for function call expression")
			}
			p.next()
			e, err := p.parseExpression(true)
			if err != nil {
				return a, err
			}
			a.dynArgs = e
		case p.isOp("**"):
			if a.dynKw != nil {
				return a, p.fail("invalid syntax for function call expression")
			}
			p.next()
			e, err := p.parseExpression(true)
			if err != nil {
				return a, err
			}
			a.dynKw = e
		case p.cur().t == tokName && p.look().t == tokOp && p.look().s == "=":
			if a.dynKw != nil {
				return a, p.fail("invalid syntax for function call expression")
			}
			key := p.next().s
			p.next()
			e, err := p.parseExpression(true)
			if err != nil {
				return a, err
			}
			a.kwNames = append(a.kwNames, key)
			a.kwVals = append(a.kwVals, e)
		default:
			if a.dynArgs != nil || a.dynKw != nil || len(a.kwNames) > 0 {
				return a, p.fail("invalid syntax for function call expression")
			}
			e, err := p.parseExpression(true)
			if err != nil {
				return a, err
			}
			a.pos = append(a.pos, e)
		}
		requireComma = true
	}
	p.next()
	return a, nil
}

func (p *parser) parseCall(e expr) (expr, error) {
	args, err := p.parseCallArgs()
	if err != nil {
		return nil, err
	}
	return &callExpr{fn: e, args: args}, nil
}

// parseFilter parses "| name(args) | ..." (startInline: the first "|" is absent).
func (p *parser) parseFilter(e expr, startInline bool) (expr, error) {
	for p.isOp("|") || startInline {
		if !startInline {
			p.next()
		}
		startInline = false
		name, err := p.expectName()
		if err != nil {
			return nil, err
		}
		for p.skipOp(".") {
			n, err := p.expectName()
			if err != nil {
				return nil, err
			}
			name += "." + n
		}
		var args callArgs
		if p.isOp("(") {
			if args, err = p.parseCallArgs(); err != nil {
				return nil, err
			}
		}
		fn := filters[name]
		if fn == nil && p.soft == 0 {
			return nil, p.fail("No filter named '%s'.", name)
		}
		e = &filterExpr{e: e, name: name, fn: fn, args: args}
	}
	return e, nil
}

func (p *parser) parseTest(e expr) (expr, error) {
	p.next() // is
	negated := p.skipName("not")
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	for p.skipOp(".") {
		n, err := p.expectName()
		if err != nil {
			return nil, err
		}
		name += "." + n
	}
	var args callArgs
	t := p.cur()
	switch {
	case p.isOp("("):
		if args, err = p.parseCallArgs(); err != nil {
			return nil, err
		}
	case (t.t == tokName || t.t == tokString || t.t == tokInt || t.t == tokFloat || (t.t == tokOp && (t.s == "(" || t.s == "[" || t.s == "{"))) &&
		!(t.t == tokName && (t.s == "else" || t.s == "or" || t.s == "and")):
		if t.t == tokName && t.s == "is" {
			return nil, p.fail("You cannot chain multiple tests with is")
		}
		a, err := p.parsePrimary()
		if err != nil {
			return nil, err
		}
		if a, err = p.parsePostfix(a); err != nil {
			return nil, err
		}
		args.pos = []expr{a}
	}
	fn := tests[name]
	if fn == nil && p.soft == 0 {
		return nil, p.fail("No test named '%s'.", name)
	}
	var out expr = &testExpr{e: e, name: name, fn: fn, args: args}
	if negated {
		out = &notExpr{e: out}
	}
	return out, nil
}
