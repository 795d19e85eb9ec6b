/**
 * Every row type a query declares (`q.query<T>(sql, ...)`) is what the
 * database says the statement returns. The table row types are generated from
 * the migrations (src/db/rows.ts), but a query that computes a column
 * (`count(*)::int8 AS n`), joins, or returns a Pick of a row still names its
 * row type by hand: this test reads each such call with the TypeScript
 * compiler, asks the migrated database to describe the statement (a
 * Parse/Describe, nothing executed), and checks that every property of T is a
 * column the statement returns, of the TypeScript type that column reads as
 * (scripts/generate-db-types.ts: int8 a number, numeric a string, time a Date).
 *
 * The SQL of a call is read when it is a literal, or a template whose
 * parts are literals, constants or conditionals of them. Statements assembled
 * at run time from a caller's filters are not checked here; their row types are
 * tables' generated rows or the same shapes as checked ones.
 */
import { before, after, test } from 'node:test';
import assert from 'node:assert/strict';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { PgliteDb } from '../../src/db/db.js';
import { migrate } from '../../src/db/migrate.js';
import { tsType } from '../../scripts/generate-db-types.js';
import { sources } from '../helpers/entry.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const SRC = join(ROOT, 'src');

interface QueryCall {
  where: string;
  sql: string | undefined;
  /** The declared row type's properties: name -> its type, without null and undefined. */
  props: Map<string, ts.Type>;
}

function findCalls(): { calls: QueryCall[]; checker: ts.TypeChecker } {
  const config = ts.getParsedCommandLineOfConfigFile(
    join(ROOT, 'tsconfig.json'),
    {},
    {
      ...ts.sys,
      onUnRecoverableConfigFileDiagnostic: (d) => assert.fail(ts.flattenDiagnosticMessageText(d.messageText, '\n')),
    },
  );
  assert.ok(config);
  const program = ts.createProgram(sources(SRC), { ...config.options, noEmit: true });
  const checker = program.getTypeChecker();

  /** The text of a string expression, where it is known before the code runs. */
  function evaluate(e: ts.Expression, depth = 0): string | undefined {
    if (depth > 8) return undefined;
    if (ts.isStringLiteral(e) || ts.isNoSubstitutionTemplateLiteral(e)) return e.text;
    if (ts.isParenthesizedExpression(e)) return evaluate(e.expression, depth + 1);
    if (ts.isTemplateExpression(e)) {
      let out = e.head.text;
      for (const span of e.templateSpans) {
        const part = evaluate(span.expression, depth + 1);
        if (part === undefined) return undefined;
        out += part + span.literal.text;
      }
      return out;
    }
    if (ts.isBinaryExpression(e) && e.operatorToken.kind === ts.SyntaxKind.PlusToken) {
      const [l, r] = [evaluate(e.left, depth + 1), evaluate(e.right, depth + 1)];
      return l === undefined || r === undefined ? undefined : l + r;
    }
    // Either branch gives the same columns (an optional FOR UPDATE, a sort order).
    if (ts.isConditionalExpression(e)) return evaluate(e.whenFalse, depth + 1);
    if (ts.isIdentifier(e) || ts.isPropertyAccessExpression(e)) {
      const type = checker.getTypeAtLocation(e);
      if (type.isStringLiteral()) return type.value;
      const symbol = checker.getSymbolAtLocation(e);
      const target = symbol && symbol.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(symbol) : symbol;
      const decl = target?.valueDeclaration;
      if (
        decl &&
        ts.isVariableDeclaration(decl) &&
        decl.initializer &&
        ts.getCombinedNodeFlags(decl) & ts.NodeFlags.Const
      )
        return evaluate(decl.initializer, depth + 1);
    }
    return undefined;
  }

  const calls: QueryCall[] = [];
  for (const file of program.getSourceFiles()) {
    if (!file.fileName.startsWith(SRC)) continue;
    const visit = (node: ts.Node): void => {
      if (
        ts.isCallExpression(node) &&
        ts.isPropertyAccessExpression(node.expression) &&
        node.expression.name.text === 'query' &&
        node.typeArguments?.length === 1 &&
        node.arguments.length >= 1
      ) {
        const rowType = checker.getTypeFromTypeNode(node.typeArguments[0]!);
        const props = new Map<string, ts.Type>();
        for (const p of checker.getPropertiesOfType(rowType)) {
          props.set(p.name, checker.getNonNullableType(checker.getTypeOfSymbolAtLocation(p, node)));
        }
        const { line } = file.getLineAndCharacterOfPosition(node.getStart());
        calls.push({ where: `${relative(ROOT, file.fileName)}:${line + 1}`, sql: evaluate(node.arguments[0]!), props });
      }
      ts.forEachChild(node, visit);
    };
    visit(file);
  }
  return { calls, checker };
}

/** Whether a value of TypeScript type `type` can hold what a column of PostgreSQL type `udt` reads as. */
function fits(checker: ts.TypeChecker, type: ts.Type, udt: string): boolean {
  if (type.flags & (ts.TypeFlags.Unknown | ts.TypeFlags.Any)) return true;
  const want = tsType(udt);
  if (want === 'unknown') return true; // json: the code gives its own shape to what it stored
  if (want.endsWith('[]')) {
    if (!checker.isArrayType(type)) return false;
    const item = checker.getTypeArguments(type as ts.TypeReference)[0];
    return item !== undefined && fits(checker, item, udt.slice(1) === 'int8' ? 'text' : udt.slice(1));
  }
  const parts = type.isUnion() ? type.types : [type];
  return parts.every((t) => {
    switch (want) {
      case 'number':
        return (t.flags & ts.TypeFlags.NumberLike) !== 0;
      case 'string':
        return (t.flags & ts.TypeFlags.StringLike) !== 0;
      case 'boolean':
        return (t.flags & ts.TypeFlags.BooleanLike) !== 0;
      default: // Date, Uint8Array: the class of that name (a Buffer is a Uint8Array)
        return [want, ...(want === 'Uint8Array' ? ['Buffer'] : [])].includes(t.getSymbol()?.name ?? '');
    }
  });
}

let db: PgliteDb;
before(async () => {
  db = await PgliteDb.open();
  await migrate(db);
});
after(() => db?.close());

test('every query<T> with SQL known before it runs returns the columns T declares, of its types', async (t) => {
  const { calls, checker } = findCalls();
  const known = calls.filter((c) => c.sql !== undefined);
  // Most calls are checked; a change that made the SQL unreadable here would show as a drop.
  assert.ok(calls.length >= 100, `found ${calls.length} query<T> calls`);
  assert.ok(known.length >= calls.length * 0.7, `${known.length} of ${calls.length} calls have SQL known here`);

  const typeNames = new Map<number, string>(
    (await db.query<{ oid: number; typname: string }>('SELECT oid::int8 AS oid, typname FROM pg_type')).rows.map(
      (r) => [r.oid, r.typname],
    ),
  );
  const problems: string[] = [];
  for (const call of known) {
    let fields: { name: string; dataTypeID: number }[];
    try {
      fields = (await db.pg.describeQuery(call.sql!)).resultFields;
    } catch (err) {
      problems.push(`${call.where}: the database refuses the statement: ${(err as Error).message}`);
      continue;
    }
    const columns = new Map(fields.map((f) => [f.name, typeNames.get(f.dataTypeID) ?? `oid ${f.dataTypeID}`]));
    for (const [name, type] of call.props) {
      const udt = columns.get(name);
      if (udt === undefined) {
        problems.push(`${call.where}: declares ${name}, which the statement does not return`);
      } else if (!fits(checker, type, udt)) {
        problems.push(
          `${call.where}: declares ${name}: ${checker.typeToString(type)}, the column is ${udt} (reads as ${tsType(udt)})`,
        );
      }
    }
  }
  const unread = calls.filter((c) => c.sql === undefined).map((c) => c.where);
  t.diagnostic(`${known.length} of ${calls.length} calls checked; SQL made at run time: ${unread.join(', ')}`);
  assert.deepEqual(problems, [], `${known.length} calls checked:\n${problems.join('\n')}`);
});
