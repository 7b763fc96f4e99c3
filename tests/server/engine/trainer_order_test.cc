#include "server/engine/trainer_order.h"

#include <vector>

#include "gtest/gtest.h"

namespace optstep {
namespace {

WaitingChunk ChunkOf(int trainer, int param, int64_t offset) {
  WaitingChunk chunk;
  chunk.handle.trainer = trainer;
  chunk.param = param;
  chunk.offset = offset;
  return chunk;
}

std::vector<int> TrainersOf(const std::vector<WaitingChunk>& chunks) {
  std::vector<int> trainers;
  for (const WaitingChunk& c : chunks) trainers.push_back(c.handle.trainer);
  return trainers;
}

TEST(TrainerOrderTest, TheTurnPassesWhenATrainerAddedAllOfAParameter) {
  TrainerOrder order(3, {10, 4});
  EXPECT_EQ(order.turn(0), 0);
  order.Wait(ChunkOf(2, 0, 0));
  order.Wait(ChunkOf(1, 0, 5));
  order.Wait(ChunkOf(1, 1, 0));
  EXPECT_TRUE(order.Added(0, 6).empty());  // trainer 0 sent 6 of 10
  std::vector<WaitingChunk> ready = order.Added(0, 4);
  EXPECT_EQ(order.turn(0), 1);
  ASSERT_EQ(TrainersOf(ready), std::vector<int>{1});  // trainer 1's chunk of param 0 only
  EXPECT_EQ(ready[0].offset, 5);
  EXPECT_EQ(order.turn(1), 0);
  ready = order.Added(0, 10);
  EXPECT_EQ(TrainersOf(ready), std::vector<int>{2});
  EXPECT_TRUE(order.Added(0, 10).empty());
  EXPECT_EQ(order.turn(0), 3);  // every trainer added all of it
  EXPECT_EQ(order.num_waiting(), 1);
}

TEST(TrainerOrderTest, TakeWaitingAndResetHandBackTheChunks) {
  TrainerOrder order(3, {4});
  order.Wait(ChunkOf(1, 0, 0));
  order.Wait(ChunkOf(2, 0, 0));
  EXPECT_EQ(TrainersOf(order.TakeWaiting(2)), std::vector<int>{2});
  EXPECT_EQ(order.num_waiting(), 1);
  EXPECT_TRUE(order.Added(0, 2).empty());
  EXPECT_EQ(TrainersOf(order.Reset()), std::vector<int>{1});
  EXPECT_EQ(order.turn(0), 0);
  EXPECT_TRUE(order.Added(0, 2).empty());  // the count restarted too
  EXPECT_EQ(order.turn(0), 0);
}

}  // namespace
}  // namespace optstep
