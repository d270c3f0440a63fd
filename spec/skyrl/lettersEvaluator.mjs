// The share of a response's characters among the letters a, b, c (see spec/skyrl/skyrlRuns.ts).
export default {
  evaluate: (_task, response) => ({
    reward: response.length === 0 ? 0 : [...response].filter((c) => 'abc'.includes(c)).length / response.length,
  }),
};
