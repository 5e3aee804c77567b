# The kNN imputation spec of the scale benchmarks (sourced by knn_stream.sh and scale.sh):
# income imputed from age (by decade), sex, race, education and marital status (Euclidean);
# four numbers (a count, a mean over ages 20-59, a proportion over ages 40-49, a variance),
# ε = 6·ln 2 per number.
#   knn_spec INPUT DOMAIN > spec.yaml
knn_spec() {
  cat <<YAML
input: $1
domain: $2
impute: [income]
match:
  - {column: age, kind: ordinal, group: 10}
  - {column: sex}
  - {column: race}
  - {column: education, kind: ordinal}
  - {column: marital}
metric: euclidean
budget: {epsilon: 4.1588830833596715}
queries:
  - {name: people, count: {}}
  - {name: mean_income_20_59, mean: {value: income, lo: 0, hi: 199999}, where: {age: [20, 59]}}
  - {name: share_above_25750_40_49, proportion: {numerator: {income: [25750, null]}}, where: {age: [40, 49]}}
  - {name: income_variance, variance: {value: income, lo: 0, hi: 199999}}
YAML
}
